/* The tensor store: named distributed tensors, each with its mesh,
 * placements, global shape, dtype, this rank's local piece and a version.
 * Tensors are immutable once inserted; an update (reshard, optimizer step)
 * inserts a new tensor under the same name, so readers holding a reference
 * never see a half-written piece. Memory is reserved against a limit before
 * it is allocated: a request over the limit fails with nothing changed. */
#ifndef DISTD_STORE_H
#define DISTD_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "errbuf.h"
#include "mesh.h"
#include "tensor.h"

#define DISTD_NAME_MAX (DIST_NAME_LEN_MAX + 1) /* a name and its NUL */

typedef struct distd_tensor {
  char name[DISTD_NAME_MAX];
  dist_dtype dtype;
  dist_shape global;
  dist_mesh_desc mesh;
  dist_placement placements[DIST_MAX_MESH_DIMS];
  int nplacements;        /* == mesh.ndim */
  dist_shape local;       /* this rank's piece (ndim 0 pieces hold 1 element) */
  int64_t offset[DIST_MAX_DIMS];
  void *data;             /* local.numel * dtype size bytes */
  size_t nbytes;
  uint64_t version;
  int refs;               /* atomic */
  struct distd_store *owner; /* memory is returned to it on the last unref */
  /* The next tensor of its store bucket, under the store's lock: a tensor
   * is held once, by name, so the store links tensors themselves and
   * storing one allocates nothing, and cannot fail for want of memory
   * after the daemons voted to apply it (distd_store_put_versioned). */
  struct distd_tensor *store_next;
} distd_tensor;

typedef struct distd_store distd_store;

distd_store *distd_store_new(uint64_t limit_bytes);
void distd_store_free(distd_store *s); /* NULL is a no-op */

/* Reserves bytes against the limit; the message says how much is needed and
 * how much is in use. Every reservation is released exactly once. */
int distd_store_reserve(distd_store *s, size_t bytes, dist_errbuf *eb);
void distd_store_release(distd_store *s, size_t bytes);

/* A new tensor with a zeroed local buffer of the right size, its memory
 * reserved (one reference, not yet in the store). */
int distd_tensor_new(distd_store *s, const char *name, dist_dtype dt,
                     const dist_shape *global, const dist_mesh_desc *mesh,
                     const dist_placement *p, int rank, distd_tensor **out,
                     dist_errbuf *eb);
/* A tensor whose layout is known only later (dtensor_from_local's, once
 * the daemons exchanged their shapes): its `reserved` bytes, reserved
 * before (distd_store_reserve), are allocated now, so that nothing is
 * left to allocate once the others agreed. The reservation passes to the
 * tensor, or is released when this fails. */
int distd_tensor_new_unplaced(distd_store *s, size_t reserved, const char *name, dist_dtype dt,
                              distd_tensor **out, dist_errbuf *eb);
/* Lays t (from distd_tensor_new_unplaced) out; allocates nothing.
 * DIST_EINTERNAL when its piece there would not be the bytes it has. */
int distd_tensor_place(distd_tensor *t, const dist_shape *global, const dist_mesh_desc *mesh,
                       const dist_placement *p, int rank, dist_errbuf *eb);
void distd_tensor_ref(distd_tensor *t);
void distd_tensor_unref(distd_tensor *t); /* NULL is a no-op */

/* Inserts t (the store takes a reference). An existing name is an error
 * unless replace, in which case the old tensor is dropped and t's version is
 * set to the old version + 1. */
int distd_store_put(distd_store *s, distd_tensor *t, int replace,
                    dist_errbuf *eb);
/* Inserts or replaces t keeping the version it carries: a version the
 * daemons agreed on, so that the pieces of one tensor carry one version
 * whatever each daemon held before (a checkpoint restore, even on a daemon
 * that restarted; a reshard onto ranks that did not hold the tensor). */
void distd_store_put_versioned(distd_store *s, distd_tensor *t);
/* Tensors made to be stored together once every daemon concerned could
 * make its own (they vote first, vote.h): a LocalLayer call's outputs, a
 * backward's gradients, an expert layer's parameters. version is the
 * highest the names had before, on any daemon. */
typedef struct distd_staged {
  size_t n;
  distd_tensor **tensors; /* NULL entries are skipped */
  uint64_t version;
} distd_staged;

int distd_staged_init(distd_staged *b, size_t n, dist_errbuf *eb);
/* Raises b->version to name's version here, when the store holds name;
 * returns whether it does, with the held tensor's mesh in *held_mesh
 * (may be NULL). */
int distd_staged_note_version(distd_store *s, distd_staged *b, const char *name,
                              dist_mesh_desc *held_mesh);
/* Cannot fail: stores every tensor of b, each at b->version + 1, so that
 * the pieces of each carry one version on every daemon. */
void distd_staged_store(distd_store *s, distd_staged *b);
void distd_staged_free(distd_staged *b); /* and the references it holds */

/* A new reference to the named tensor, or DIST_ENOTFOUND. */
int distd_store_get(distd_store *s, const char *name, distd_tensor **out,
                    dist_errbuf *eb);
int distd_store_delete(distd_store *s, const char *name, dist_errbuf *eb);
/* References to every tensor, sorted by name; *out is malloc'd; unref each
 * and free the array. */
int distd_store_list(distd_store *s, distd_tensor ***out, int *count);
void distd_store_usage(distd_store *s, uint64_t *used, uint64_t *limit,
                       int *count);

#endif
