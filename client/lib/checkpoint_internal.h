/* What checkpoint_api.c (save, restore) and checkpoint_rebuild.c (restore
 * onto fewer daemons) share: the manifest as restore reads it. */
#ifndef DIST_CHECKPOINT_INTERNAL_H
#define DIST_CHECKPOINT_INTERNAL_H

#include "client_internal.h"

/* One tensor as the manifest describes it. */
typedef struct ckpt_entry {
  dist_tensor t;
  uint64_t version;
  int with_state; /* saved with its optimizer state */
} ckpt_entry;

typedef struct ckpt_manifest {
  int nfiles, ntensors;
  char (*file)[256];
  char (*sha)[80];
  ckpt_entry *tensors;
} ckpt_manifest;

/* Whether every rank of e's saved mesh is a daemon of this cluster. */
int dist_ckpt_fits(const dist_client *c, const ckpt_entry *e);

/* The whole values of the tensors marked in rebuild[] (saved on ranks the
 * cluster lacks; Shard and Replicate only), read piece by piece from the
 * rank files through this cluster's daemons, which share the directory.
 * Every file read is checked against its sha256 first, so a bad file
 * fails here, before anything is restored; o's progress hears of each
 * file read ("read"). full[i] is malloc'd (free()); nbytes[i] its size. */
int dist_ckpt_read_whole(dist_client *c, const char *dir, const ckpt_manifest *m,
                         const char *rebuild, const dist_checkpoint_opts *o,
                         void **full, size_t *nbytes);

#endif
