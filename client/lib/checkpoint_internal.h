/* What checkpoint_api.c (save, restore) and checkpoint_rebuild.c (restore
 * onto fewer daemons) share: the manifest as restore reads it. */
#ifndef DIST_CHECKPOINT_INTERNAL_H
#define DIST_CHECKPOINT_INTERNAL_H

#include "client_internal.h"
#include "param.pb-c.h"

/* One tensor as the manifest describes it. */
typedef struct ckpt_entry {
  dist_tensor t;
  uint64_t version;
  int with_state; /* saved with its optimizer state */
} ckpt_entry;

typedef struct ckpt_manifest {
  char id[80]; /* checkpoint_id ("" in a manifest without one) */
  int nfiles, ntensors;
  char (*file)[256];
  char (*sha)[80];
  ckpt_entry *tensors;
} ckpt_manifest;

/* How restore brings a manifest tensor back. */
enum { CKPT_SKIP = 0, CKPT_LOAD = 1 /* by the daemons of its saved ranks */,
       CKPT_REBUILD = 2 /* through the client: saved on ranks the cluster lacks */ };

/* The highest rank of e's saved mesh that is not a daemon of this
 * cluster, or -1 when it has them all. */
int dist_ckpt_missing_rank(const dist_client *c, const ckpt_entry *e);

/* 1 and *op when t has Partial dims that all reduce with op, -1 when they
 * reduce differently, 0 when it has none. */
int dist_ckpt_partial_reduce(const dist_tensor *t, dist_reduce *op);

/* A parameter's optimizer state put together from the rank files. */
typedef struct ckpt_state {
  int found;  /* the files saved the tensor as a parameter */
  Dist__V1__ParamConfigureRequest cfg; /* its configuration and step; the
                                        * optimizer is `optimizer` */
  Dist__V1__OptimizerConfig optimizer;
  int nstate;
  void *whole[DIST_OPTIM_STATE_MAX]; /* each of the tensor's global shape, malloc'd */
} ckpt_state;
void dist_ckpt_state_free(ckpt_state *s);

/* The whole values of the tensors how[] marks CKPT_REBUILD (saved on ranks
 * the cluster lacks, or restored onto a mesh of another shape; Partial
 * pieces reduced), read piece by piece from the rank files through this
 * cluster's daemons, which share the directory, and with them the
 * optimizer state of those saved as parameters (state[i]). Every file
 * read is checked against its sha256 first, so a bad file fails here,
 * before anything is restored; o's progress hears of each file read
 * ("read"). full[i] is malloc'd (free()); nbytes[i] its size. */
int dist_ckpt_read_whole(dist_client *c, const char *dir, const ckpt_manifest *m,
                         const char *how, const dist_checkpoint_opts *o,
                         void **full, size_t *nbytes, ckpt_state *state);

#endif
