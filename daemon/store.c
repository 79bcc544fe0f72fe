#include "store.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"

#define BUCKETS 1024

struct distd_store {
  pthread_mutex_t mu;
  uint64_t limit; /* 0 = none */
  uint64_t used;
  int count;
  distd_tensor *buckets[BUCKETS]; /* chained through store_next */
};

static unsigned hash_name(const char *s) {
  unsigned h = 2166136261u; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h % BUCKETS;
}

distd_store *distd_store_new(uint64_t limit_bytes) {
  distd_store *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  pthread_mutex_init(&s->mu, NULL);
  s->limit = limit_bytes;
  return s;
}

void distd_store_free(distd_store *s) {
  if (!s) return;
  for (int b = 0; b < BUCKETS; b++) {
    distd_tensor *t = s->buckets[b];
    while (t) {
      distd_tensor *next = t->store_next;
      t->owner = NULL; /* the store is going: nothing to return memory to */
      distd_tensor_unref(t);
      t = next;
    }
  }
  pthread_mutex_destroy(&s->mu);
  free(s);
}

int distd_store_reserve(distd_store *s, size_t bytes, dist_errbuf *eb) {
  pthread_mutex_lock(&s->mu);
  int over = s->limit && s->used + bytes > s->limit;
  if (!over) s->used += bytes;
  uint64_t used = s->used, limit = s->limit;
  pthread_mutex_unlock(&s->mu);
  if (!over) return 0;
  char need[32], in_use[32], lim[32];
  dist_format_bytes(bytes, need, sizeof need);
  dist_format_bytes(used, in_use, sizeof in_use);
  dist_format_bytes(limit, lim, sizeof lim);
  return dist_fail(eb, DIST_ENOMEM,
                   "memory limit: %s more needed, %s of %s already in use",
                   need, in_use, lim);
}

void distd_store_release(distd_store *s, size_t bytes) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  s->used -= bytes;
  pthread_mutex_unlock(&s->mu);
}

/* A tensor named name of dtype dt, its layout not yet set. */
static int tensor_shell(const char *name, dist_dtype dt, distd_tensor **out, dist_errbuf *eb) {
  /* "" is a private buffer's, never stored; any other name may be. */
  if (name[0] && dist_name_check(name, eb) != 0) return eb->code;
  distd_tensor *t = calloc(1, sizeof *t);
  if (!t) return dist_fail(eb, DIST_ENOMEM, "out of memory for tensor '%s'", name);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->dtype = dt;
  *out = t;
  return 0;
}

/* Sets t's layout and the bytes of its piece on rank. */
static void tensor_lay_out(distd_tensor *t, const dist_shape *global, const dist_mesh_desc *mesh,
                           const dist_placement *p, int rank) {
  t->global = *global;
  t->mesh = *mesh;
  t->nplacements = mesh->ndim;
  memcpy(t->placements, p, sizeof *p * (size_t)mesh->ndim);
  int idx = dist_mesh_index_of(mesh, rank);
  if (idx >= 0) {
    int coords[DIST_MAX_MESH_DIMS];
    dist_mesh_coords(mesh, idx, coords);
    dist_local_box(mesh, p, global, coords, &t->local, t->offset);
  } else { /* not on this mesh: an empty piece */
    t->local = *global;
    if (t->local.ndim > 0) t->local.dims[0] = 0;
  }
  t->nbytes = (size_t)dist_shape_numel(&t->local) * dist_dtype_size(t->dtype);
  if (idx < 0) t->nbytes = 0;
}

/* Gives t its zeroed t->nbytes of data (reserved already), or frees t. */
static int tensor_fill(distd_store *s, distd_tensor *t, distd_tensor **out, dist_errbuf *eb) {
  t->data = calloc(1, t->nbytes ? t->nbytes : 1);
  if (!t->data) {
    int rc = dist_fail(eb, DIST_ENOMEM, "out of memory for the %zu bytes of tensor '%s'",
                       t->nbytes, t->name);
    free(t);
    return rc;
  }
  t->refs = 1;
  t->owner = s;
  *out = t;
  return 0;
}

int distd_tensor_new(distd_store *s, const char *name, dist_dtype dt,
                     const dist_shape *global, const dist_mesh_desc *mesh,
                     const dist_placement *p, int rank, distd_tensor **out,
                     dist_errbuf *eb) {
  distd_tensor *t = NULL;
  int rc = tensor_shell(name, dt, &t, eb);
  if (rc != 0) return rc;
  tensor_lay_out(t, global, mesh, p, rank);
  size_t nbytes = t->nbytes;
  if ((rc = distd_store_reserve(s, nbytes, eb)) != 0) {
    free(t);
    return rc;
  }
  rc = tensor_fill(s, t, out, eb);
  if (rc != 0) distd_store_release(s, nbytes);
  return rc;
}

int distd_tensor_new_unplaced(distd_store *s, size_t reserved, const char *name, dist_dtype dt,
                              distd_tensor **out, dist_errbuf *eb) {
  distd_tensor *t = NULL;
  int rc = tensor_shell(name, dt, &t, eb);
  if (rc == 0) {
    t->nbytes = reserved;
    rc = tensor_fill(s, t, out, eb);
  }
  if (rc != 0) distd_store_release(s, reserved);
  return rc;
}

int distd_tensor_place(distd_tensor *t, const dist_shape *global, const dist_mesh_desc *mesh,
                       const dist_placement *p, int rank, dist_errbuf *eb) {
  size_t nbytes = t->nbytes;
  tensor_lay_out(t, global, mesh, p, rank);
  if (t->nbytes == nbytes) return 0;
  size_t need = t->nbytes;
  t->nbytes = nbytes; /* so that the unref releases what was reserved */
  return dist_fail(eb, DIST_EINTERNAL, "'%s' needs %zu bytes here, not the %zu allocated",
                   t->name, need, nbytes);
}

void distd_tensor_ref(distd_tensor *t) {
  __atomic_add_fetch(&t->refs, 1, __ATOMIC_SEQ_CST);
}

void distd_tensor_unref(distd_tensor *t) {
  if (!t || __atomic_sub_fetch(&t->refs, 1, __ATOMIC_SEQ_CST) > 0) return;
  distd_store_release(t->owner, t->nbytes);
  free(t->data);
  free(t);
}

static distd_tensor **find(distd_store *s, const char *name) {
  distd_tensor **e = &s->buckets[hash_name(name)];
  while (*e && strcmp((*e)->name, name) != 0) e = &(*e)->store_next;
  return e;
}

static int put(distd_store *s, distd_tensor *t, int replace, int keep_version,
               dist_errbuf *eb) {
  pthread_mutex_lock(&s->mu);
  distd_tensor **e = find(s, t->name), *old = *e;
  if (old && !replace) {
    pthread_mutex_unlock(&s->mu);
    return dist_fail(eb, DIST_EEXIST, "tensor '%s' already exists", t->name);
  }
  distd_tensor_ref(t);
  if (old) {
    if (!keep_version) t->version = old->version + 1;
    t->store_next = old->store_next;
  } else {
    t->store_next = NULL;
    s->count++;
    if (t->version == 0) t->version = 1;
  }
  *e = t;
  pthread_mutex_unlock(&s->mu);
  distd_tensor_unref(old); /* outside the lock: it may release memory */
  return 0;
}

int distd_store_put(distd_store *s, distd_tensor *t, int replace,
                    dist_errbuf *eb) {
  return put(s, t, replace, 0, eb);
}

void distd_store_put_versioned(distd_store *s, distd_tensor *t) {
  put(s, t, 1, 1, NULL); /* replacing never fails */
}

int distd_staged_init(distd_staged *b, size_t n, dist_errbuf *eb) {
  b->n = n;
  b->version = 0;
  b->tensors = calloc(n + 1, sizeof *b->tensors);
  return b->tensors ? 0 : dist_fail(eb, DIST_ENOMEM, "out of memory");
}

int distd_staged_note_version(distd_store *s, distd_staged *b, const char *name,
                              dist_mesh_desc *held_mesh) {
  distd_tensor *t = NULL;
  if (distd_store_get(s, name, &t, NULL) != 0) return 0;
  if (t->version > b->version) b->version = t->version;
  if (held_mesh) *held_mesh = t->mesh;
  distd_tensor_unref(t);
  return 1;
}

void distd_staged_store(distd_store *s, distd_staged *b) {
  for (size_t k = 0; k < b->n; k++) {
    if (!b->tensors[k]) continue;
    b->tensors[k]->version = b->version + 1;
    distd_store_put_versioned(s, b->tensors[k]);
  }
}

void distd_staged_free(distd_staged *b) {
  for (size_t k = 0; b->tensors && k < b->n; k++) distd_tensor_unref(b->tensors[k]);
  free(b->tensors);
  b->tensors = NULL;
}

int distd_store_get(distd_store *s, const char *name, distd_tensor **out,
                    dist_errbuf *eb) {
  pthread_mutex_lock(&s->mu);
  distd_tensor *t = *find(s, name); /* referenced under the lock: a delete may free it */
  if (t) {
    *out = t;
    distd_tensor_ref(t);
  }
  pthread_mutex_unlock(&s->mu);
  if (!t) return dist_fail(eb, DIST_ENOTFOUND, "tensor '%s' not found", name);
  return 0;
}

int distd_store_delete(distd_store *s, const char *name, dist_errbuf *eb) {
  pthread_mutex_lock(&s->mu);
  distd_tensor **e = find(s, name), *gone = *e;
  if (gone) {
    *e = gone->store_next;
    s->count--;
  }
  pthread_mutex_unlock(&s->mu);
  if (!gone) return dist_fail(eb, DIST_ENOTFOUND, "tensor '%s' not found", name);
  distd_tensor_unref(gone);
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp((*(distd_tensor *const *)a)->name,
                (*(distd_tensor *const *)b)->name);
}

int distd_store_list(distd_store *s, distd_tensor ***out, int *count) {
  pthread_mutex_lock(&s->mu);
  distd_tensor **all = calloc((size_t)s->count + 1, sizeof *all);
  int n = 0;
  for (int b = 0; all && b < BUCKETS; b++)
    for (distd_tensor *t = s->buckets[b]; t; t = t->store_next) {
      distd_tensor_ref(t);
      all[n++] = t;
    }
  pthread_mutex_unlock(&s->mu);
  if (!all) return DIST_ENOMEM;
  qsort(all, (size_t)n, sizeof *all, by_name);
  *out = all;
  *count = n;
  return 0;
}

void distd_store_usage(distd_store *s, uint64_t *used, uint64_t *limit,
                       int *count) {
  pthread_mutex_lock(&s->mu);
  *used = s->used;
  *limit = s->limit;
  *count = s->count;
  pthread_mutex_unlock(&s->mu);
}
