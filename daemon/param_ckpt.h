/* Parameters in checkpoint files. Next to a parameter's values, a rank file
 * holds its optimizer state buffers (momentum, Adam's m and v) as entries of
 * their own, and the "__metadata__" key DISTD_CKPT_OPTIM_KEY maps each
 * parameter's name to its configuration, the updates applied so far and the
 * names of those entries:
 *
 *   {"w": {"optimizer": "adamw", "lr": 0.001, ..., "reduce": "avg",
 *          "async": false, "trainers": 2, "step": 7,
 *          "state": ["#optim.3.0", "#optim.3.1"]}}
 *
 * so a restored parameter continues its updates exactly as it would have. */
#ifndef DISTD_PARAM_CKPT_H
#define DISTD_PARAM_CKPT_H

#include <jansson.h>

#include "param_service.h"
#include "safetensors.h"

#define DISTD_CKPT_OPTIM_KEY "distd.optimizer"

/* What one rank file holds: the tensors' pieces, then the state buffers. */
typedef struct distd_ckpt_contents {
  dist_st_tensor *entries;
  int n;
  char *optim_json; /* the metadata value; NULL when no parameter is saved */
  char **names;     /* the state entries' names (entries point into them) */
  int nnames;
} distd_ckpt_contents;

/* Lists t[0..n) and, where snap[i].tensor is set (then t[i] is it), that
 * parameter's state. */
int distd_ckpt_contents_build(distd_tensor *const *t, const distd_param_snapshot *snap,
                              int n, distd_ckpt_contents *out, dist_errbuf *eb);
void distd_ckpt_contents_free(distd_ckpt_contents *c);

/* For the n pieces t[] built from file f (named `file` in messages):
 * entries[i] is the parameter to install with t[i], or NULL when the file
 * saved t[i] without optimizer state. Everything is checked against the
 * pieces (configuration, state entries' dtype and shape) and the state's
 * memory reserved; on failure nothing is. */
int distd_ckpt_params_read(const dist_st_file *f, const char *file, distd_store *st,
                           distd_tensor *const *t, int n, distd_param_entry **entries,
                           dist_errbuf *eb);

/* The optimizer metadata of f, parsed (json_decref it); *optim stays NULL
 * when f saved no parameter. */
int distd_ckpt_optim_parse(const dist_st_file *f, const char *file, json_t **optim,
                           dist_errbuf *eb);

/* A parameter as a rank file saved it. */
typedef struct distd_ckpt_param {
  distd_param_cfg cfg;
  uint64_t step;
  int nstate;
  const dist_st_entry *state[DISTD_OPTIM_STATE_MAX]; /* point into the file */
} distd_ckpt_param;

/* 1 and *out when f saved `name` as a parameter (optim: the parsed
 * metadata, may be NULL), its state buffers checked to be dt pieces of
 * shape `piece`; 0 when f saved it as plain values; an error when the
 * metadata or the buffers are malformed. */
int distd_ckpt_param_find(const dist_st_file *f, const char *file, json_t *optim,
                          const char *name, dist_dtype dt, const dist_shape *piece,
                          distd_ckpt_param *out, dist_errbuf *eb);

#endif
