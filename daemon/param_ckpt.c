/* Parameters in checkpoint files: see param_ckpt.h. */
#include "param_ckpt.h"
#include "json_memory.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- writing ---- */

static json_t *cfg_json(const distd_param_snapshot *s, json_t *state_names) {
  const distd_optim_cfg *o = &s->cfg.optim;
  return json_pack("{s:s, s:f, s:f, s:f, s:b, s:f, s:f, s:f, s:f, s:s, s:b, s:i, "
                   "s:I, s:o}",
                   "optimizer", distd_optim_name(o->kind), "lr", o->lr,
                   "momentum", o->momentum, "dampening", o->dampening,
                   "nesterov", o->nesterov, "beta1", o->beta1, "beta2", o->beta2,
                   "eps", o->eps, "weight_decay", o->weight_decay,
                   "reduce", dist_reduce_name(s->cfg.reduce), "async", s->cfg.async,
                   "trainers", s->cfg.trainers, "step", (json_int_t)s->step,
                   "state", state_names);
}

static int name_taken(const distd_ckpt_contents *c, const char *name) {
  for (int i = 0; i < c->n; i++)
    if (strcmp(c->entries[i].name, name) == 0) return 1;
  return 0;
}

/* "#optim.<i>.<k>" for state buffer k of tensor i, with more '#' in front
 * until no other entry has the name (tensor names are free-form). Short
 * whatever the parameter's name, so it fits the framing's name limit. */
static char *state_name(const distd_ckpt_contents *c, int i, int k) {
  char *name = malloc(DIST_ST_NAME_MAX);
  if (!name) return NULL;
  int hashes = 1;
  do
    snprintf(name, DIST_ST_NAME_MAX, "%.*s#optim.%d.%d", hashes - 1,
             "################################", i, k);
  while (name_taken(c, name) && ++hashes <= 33);
  return name;
}

static int add_state(distd_ckpt_contents *c, int i, const distd_param_snapshot *s,
                     json_t *params, dist_errbuf *eb) {
  json_t *names = json_array();
  int failed = !names;
  for (int k = 0; k < s->nstate; k++) {
    char *name = state_name(c, i, k);
    if (!name) {
      json_decref(names);
      return dist_fail(eb, DIST_ENOMEM, "out of memory naming optimizer state");
    }
    c->names[c->nnames++] = name;
    c->entries[c->n++] = (dist_st_tensor){name, s->tensor->dtype, s->tensor->local,
                                          s->state[k]};
    failed |= json_array_append_new(names, json_string(name)) != 0;
  }
  json_t *cfg = failed ? NULL : cfg_json(s, names); /* takes names, even failing */
  if (failed) json_decref(names);
  failed |= json_object_set_new(params, s->tensor->name, cfg) != 0;
  if (failed) return dist_fail(eb, DIST_ENOMEM, "out of memory describing the optimizer "
                               "state of '%s'", s->tensor->name);
  return 0;
}

int distd_ckpt_contents_build(distd_tensor *const *t, const distd_param_snapshot *snap,
                              int n, distd_ckpt_contents *out, dist_errbuf *eb) {
  memset(out, 0, sizeof *out);
  out->entries = calloc(3 * (size_t)n + 1, sizeof *out->entries);
  out->names = calloc(2 * (size_t)n + 1, sizeof *out->names);
  if (!out->entries || !out->names) {
    distd_ckpt_contents_free(out);
    return dist_fail(eb, DIST_ENOMEM, "out of memory listing a checkpoint");
  }
  for (int i = 0; i < n; i++)
    out->entries[out->n++] = (dist_st_tensor){t[i]->name, t[i]->dtype, t[i]->local,
                                              t[i]->data};
  json_t *params = json_object();
  int rc = params ? 0 : dist_fail(eb, DIST_ENOMEM, "out of memory listing a checkpoint");
  for (int i = 0; i < n && rc == 0; i++)
    if (snap[i].tensor) rc = add_state(out, i, &snap[i], params, eb);
  if (rc == 0 && json_object_size(params) > 0 &&
      !(out->optim_json = dist_json_dumps(params, JSON_COMPACT | JSON_SORT_KEYS)))
    rc = dist_fail(eb, DIST_ENOMEM, "out of memory writing the optimizer state's description");
  json_decref(params);
  if (rc != 0) distd_ckpt_contents_free(out);
  return rc;
}

void distd_ckpt_contents_free(distd_ckpt_contents *c) {
  for (int i = 0; i < c->nnames; i++) free(c->names[i]);
  free(c->names);
  free(c->entries);
  free(c->optim_json);
  memset(c, 0, sizeof *c);
}

/* ---- reading ---- */

static int parse_kind(const char *name, distd_optim_kind *kind) {
  for (int k = DISTD_OPT_SGD; k <= DISTD_OPT_ADAMW; k++)
    if (strcmp(name, distd_optim_name((distd_optim_kind)k)) == 0) {
      *kind = (distd_optim_kind)k;
      return 0;
    }
  return -1;
}

static int bad(dist_errbuf *eb, const char *file, const char *name, const char *what) {
  return dist_fail(eb, DIST_EINVAL, "%s: the optimizer state of '%s' %s", file, name,
                   what);
}

/* 0, 1 when j is not a configuration, -1 when jansson could not allocate. */
static int parse_cfg(json_t *j, distd_param_cfg *cfg, uint64_t *step, json_t **state) {
  const char *kind, *reduce;
  int nesterov, async;
  json_int_t st;
  memset(cfg, 0, sizeof *cfg);
  distd_optim_cfg *o = &cfg->optim;
  int unpacked = dist_json_unpack(j, "{s:s, s:F, s:F, s:F, s:b, s:F, s:F, s:F, s:F, s:s, "
                                  "s:b, s:i, s:I, s:o}", "optimizer", &kind, "lr", &o->lr,
                                  "momentum", &o->momentum, "dampening", &o->dampening,
                                  "nesterov", &nesterov, "beta1", &o->beta1, "beta2",
                                  &o->beta2, "eps", &o->eps, "weight_decay",
                                  &o->weight_decay, "reduce", &reduce, "async", &async,
                                  "trainers", &cfg->trainers, "step", &st, "state", state);
  if (unpacked != 0) return unpacked;
  if (st < 0 || !json_is_array(*state)) return 1;
  o->nesterov = nesterov;
  cfg->async = async;
  *step = (uint64_t)st;
  return parse_kind(kind, &o->kind) != 0 || dist_reduce_parse(reduce, &cfg->reduce) != 0
             ? 1 : 0;
}

/* The state buffers named in `names`, each exactly a dt piece of shape
 * `piece`. */
static int find_state(const dist_st_file *f, const char *file, const char *name,
                      dist_dtype dt, const dist_shape *piece, json_t *names,
                      distd_ckpt_param *out, dist_errbuf *eb) {
  if ((int)json_array_size(names) != out->nstate)
    return bad(eb, file, name, "has the wrong number of buffers");
  for (int k = 0; k < out->nstate; k++) {
    const char *en = json_string_value(json_array_get(names, (size_t)k));
    const dist_st_entry *e = en ? dist_st_find(f, en) : NULL;
    if (!e) return bad(eb, file, name, "names a buffer the file lacks");
    if (e->dtype != dt || !dist_shape_equal(&e->shape, piece))
      return bad(eb, file, name, "is not shaped as its piece");
    out->state[k] = e;
  }
  return 0;
}

int distd_ckpt_optim_parse(const dist_st_file *f, const char *file, json_t **optim,
                           dist_errbuf *eb) {
  *optim = NULL;
  const char *text = dist_st_meta(f, DISTD_CKPT_OPTIM_KEY);
  if (!text) return 0; /* no parameter, or a checkpoint from before they were kept */
  json_error_t jerr;
  int no_memory;
  json_t *params = dist_json_loadb(text, strlen(text), 0, &jerr, &no_memory);
  if (json_is_object(params)) {
    *optim = params;
    return 0;
  }
  json_decref(params);
  if (no_memory)
    return dist_fail(eb, DIST_ENOMEM, "%s: out of memory reading metadata %s", file,
                     DISTD_CKPT_OPTIM_KEY);
  return dist_fail(eb, DIST_EINVAL, "%s: metadata %s is not a JSON object", file,
                   DISTD_CKPT_OPTIM_KEY);
}

int distd_ckpt_param_find(const dist_st_file *f, const char *file, json_t *optim,
                          const char *name, dist_dtype dt, const dist_shape *piece,
                          distd_ckpt_param *out, dist_errbuf *eb) {
  memset(out, 0, sizeof *out);
  json_t *j = optim ? json_object_get(optim, name) : NULL, *names;
  if (!j) return 0;
  int parsed = parse_cfg(j, &out->cfg, &out->step, &names);
  if (parsed < 0)
    return dist_fail(eb, DIST_ENOMEM, "%s: out of memory reading the optimizer state of '%s'",
                     file, name);
  if (parsed > 0) return bad(eb, file, name, "has a malformed configuration");
  out->nstate = distd_optim_state_count(&out->cfg.optim);
  int rc = find_state(f, file, name, dt, piece, names, out, eb);
  return rc != 0 ? rc : 1;
}

static int read_one(const dist_st_file *f, const char *file, distd_store *st,
                    json_t *optim, const distd_tensor *t, distd_param_entry **out,
                    dist_errbuf *eb) {
  distd_ckpt_param cp;
  int rc = distd_ckpt_param_find(f, file, optim, t->name, t->dtype, &t->local, &cp, eb);
  if (rc <= 0) return rc;
  const void *state[DISTD_OPTIM_STATE_MAX] = {NULL};
  for (int k = 0; k < cp.nstate; k++) state[k] = cp.state[k]->data;
  if ((rc = distd_param_prepare(st, t, &cp.cfg, cp.step, state, out, eb)) != 0)
    dist_errbuf_prefix(eb, "%s: ", file);
  return rc;
}

int distd_ckpt_params_read(const dist_st_file *f, const char *file, distd_store *st,
                           distd_tensor *const *t, int n, distd_param_entry **entries,
                           dist_errbuf *eb) {
  for (int i = 0; i < n; i++) entries[i] = NULL;
  json_t *optim = NULL;
  int rc = distd_ckpt_optim_parse(f, file, &optim, eb);
  for (int i = 0; i < n && rc == 0 && optim; i++)
    rc = read_one(f, file, st, optim, t[i], &entries[i], eb);
  json_decref(optim);
  for (int i = 0; i < n && rc != 0; i++) {
    distd_param_entry_free(entries[i]);
    entries[i] = NULL;
  }
  return rc;
}
