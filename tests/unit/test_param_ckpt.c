/* Parameters in checkpoint files (daemon/param_ckpt.c): a parameter's
 * configuration, step and state buffers survive the safetensors round trip
 * bit for bit, and every malformed description is refused with the file and
 * the parameter named and no memory left reserved. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "jansson_failing.h"
#include "param_ckpt.h"
#include "store.h"

static distd_store *st;
static distd_tensor *w;

static void setup(void) {
  st = distd_store_new(1 << 20);
  dist_shape g = {.ndim = 2, .dims = {2, 3}};
  dist_mesh_desc m;
  int shape[1] = {1}, ranks[1] = {0};
  cr_assert_eq(dist_mesh_init(&m, 1, shape, ranks, NULL, NULL), 0);
  dist_placement p[1] = {{.kind = DIST_REPLICATE}};
  cr_assert_eq(distd_tensor_new(st, "w", DIST_FLOAT32, &g, &m, p, 0, &w, NULL), 0);
  for (int i = 0; i < 6; i++) ((float *)w->data)[i] = (float)i;
}

static void teardown(void) {
  distd_tensor_unref(w);
  distd_store_free(st);
}

TestSuite(param_ckpt, .init = setup, .fini = teardown);

static const float m_state[6] = {0.5f, -1, 2, 1e-30f, 3, -0.25f};
static const float v_state[6] = {1, 2, 3, 4, 5, 6.5f};

static distd_param_cfg adamw_cfg(void) {
  distd_param_cfg c = {.reduce = DIST_REDUCE_AVG, .trainers = 3};
  c.optim = (distd_optim_cfg){.kind = DISTD_OPT_ADAMW, .lr = 0.1 / 3, .beta1 = 0.9,
                              .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
  return c;
}

/* A registry where w is an AdamW parameter at step 7 with the state above. */
static distd_params *params_with_w(void) {
  distd_params *p = distd_params_new(0);
  cr_assert_eq(distd_store_put(st, w, 0, NULL), 0);
  distd_param_cfg cfg = adamw_cfg();
  const void *state[2] = {m_state, v_state};
  distd_param_entry *e = NULL;
  cr_assert_eq(distd_param_prepare(st, w, &cfg, 7, state, &e, NULL), 0);
  distd_param_install(p, e);
  return p;
}

/* The file a rank would write for tensors t[0..n) of registry p. */
static void *encode(distd_params *p, distd_tensor **t, int n, size_t *len) {
  distd_param_snapshot snap[4];
  for (int i = 0; i < n; i++)
    cr_assert_eq(distd_param_snapshot_take(p, st, t[i]->name, &snap[i], NULL), 0);
  distd_ckpt_contents cc;
  cr_assert_eq(distd_ckpt_contents_build(t, snap, n, &cc, NULL), 0);
  const char *meta[] = {DISTD_CKPT_OPTIM_KEY, cc.optim_json};
  void *bytes = NULL;
  cr_assert_eq(dist_st_encode(cc.entries, cc.n, meta, cc.optim_json ? 1 : 0, &bytes,
                              len, NULL), 0);
  distd_ckpt_contents_free(&cc);
  for (int i = 0; i < n; i++) distd_param_snapshot_free(&snap[i]);
  return bytes;
}

/* The file of w in registry p, parsed; *bytes holds it (free it after f). */
static dist_st_file *w_file(distd_params *p, void **bytes) {
  size_t len = 0;
  *bytes = encode(p, &w, 1, &len);
  dist_st_file *f = NULL;
  cr_assert_eq(dist_st_parse(*bytes, len, &f, NULL), 0);
  return f;
}

Test(param_ckpt, configuration_step_and_state_survive_the_file) {
  distd_params *p = params_with_w();
  void *bytes = NULL;
  dist_st_file *f = w_file(p, &bytes);
  distd_param_entry *e = NULL;
  cr_assert_eq(distd_ckpt_params_read(f, "rank0.x.safetensors", st, &w, 1, &e, NULL), 0);
  cr_assert_not_null(e);
  distd_params *q = distd_params_new(0);
  distd_param_install(q, e);
  distd_param_snapshot s;
  cr_assert_eq(distd_param_snapshot_take(q, st, "w", &s, NULL), 0);
  cr_assert_not_null(s.tensor);
  distd_param_cfg want = adamw_cfg();
  const distd_optim_cfg *o = &s.cfg.optim, *wo = &want.optim;
  cr_assert(o->kind == wo->kind && o->lr == wo->lr && o->beta1 == wo->beta1 &&
            o->beta2 == wo->beta2 && o->eps == wo->eps &&
            o->weight_decay == wo->weight_decay && o->momentum == wo->momentum &&
            o->dampening == wo->dampening && o->nesterov == wo->nesterov,
            "optimizer configuration changed: lr %.17g", o->lr);
  cr_assert(s.cfg.reduce == want.reduce && s.cfg.async == want.async &&
            s.cfg.trainers == want.trainers, "parameter configuration changed");
  cr_assert_eq(s.step, 7);
  cr_assert_eq(s.nstate, 2);
  cr_assert_eq(memcmp(s.state[0], m_state, sizeof m_state), 0);
  cr_assert_eq(memcmp(s.state[1], v_state, sizeof v_state), 0);
  distd_param_snapshot_free(&s);
  dist_st_free(f);
  free(bytes);
  distd_params_free(q);
  distd_params_free(p);
}

Test(param_ckpt, state_entries_never_take_a_tensors_name) {
  distd_params *p = params_with_w();
  distd_tensor *clash = NULL;
  dist_shape g = {.ndim = 1, .dims = {2}};
  cr_assert_eq(distd_tensor_new(st, "#optim.1.0", DIST_INT64, &g, &w->mesh,
                                w->placements, 0, &clash, NULL), 0);
  distd_tensor *t[2] = {clash, w};
  size_t len = 0;
  void *bytes = encode(p, t, 2, &len);
  dist_st_file *f = NULL;
  cr_assert_eq(dist_st_parse(bytes, len, &f, NULL), 0);
  cr_assert_eq(f->count, 4);
  cr_assert_eq(dist_st_find(f, "#optim.1.0")->dtype, DIST_INT64);
  cr_assert_not_null(dist_st_find(f, "##optim.1.0"));
  distd_param_entry *e[2] = {NULL, NULL};
  cr_assert_eq(distd_ckpt_params_read(f, "r", st, t, 2, e, NULL), 0);
  cr_assert_null(e[0], "the plain tensor is no parameter");
  cr_assert_not_null(e[1]);
  distd_param_entry_free(e[1]);
  dist_st_free(f);
  free(bytes);
  distd_tensor_unref(clash);
  distd_params_free(p);
}

/* A file whose metadata says `meta` about w, with w's piece and buffers
 * named a and b (float32 [2,3]) and c (float32 [3,2]). */
static int read_with(const char *meta, char *msg, size_t msg_len) {
  float zero[6] = {0};
  dist_shape s23 = {.ndim = 2, .dims = {2, 3}}, s32 = {.ndim = 2, .dims = {3, 2}};
  dist_st_tensor ents[4] = {{"w", DIST_FLOAT32, s23, w->data},
                            {"a", DIST_FLOAT32, s23, zero},
                            {"b", DIST_FLOAT32, s23, zero},
                            {"c", DIST_FLOAT32, s32, zero}};
  const char *kv[] = {DISTD_CKPT_OPTIM_KEY, meta};
  void *bytes = NULL;
  size_t len = 0;
  cr_assert_eq(dist_st_encode(ents, 4, kv, 1, &bytes, &len, NULL), 0);
  dist_st_file *f = NULL;
  cr_assert_eq(dist_st_parse(bytes, len, &f, NULL), 0);
  uint64_t before = 0, after = 0, limit = 0;
  int count = 0;
  distd_store_usage(st, &before, &limit, &count);
  distd_param_entry *e = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = distd_ckpt_params_read(f, "rank0.c.safetensors", st, &w, 1, &e, &eb);
  snprintf(msg, msg_len, "%s", dist_errbuf_msg(&eb));
  distd_store_usage(st, &after, &limit, &count);
  if (rc != 0) {
    cr_assert_null(e);
    cr_assert_eq(after, before, "a refused read left memory reserved");
  }
  distd_param_entry_free(e);
  dist_st_free(f);
  free(bytes);
  return rc;
}

#define COMMON_FIELDS                                                                 \
  "\"momentum\": 0, \"dampening\": 0, \"nesterov\": false, \"beta1\": 0.9, "            \
  "\"beta2\": 0.999, \"eps\": 1e-8, \"weight_decay\": 0, \"reduce\": \"sum\", "           \
  "\"async\": true, \"trainers\": 1, \"step\": 2, "
#define ADAMW_FIELDS "\"optimizer\": \"adamw\", \"lr\": 0.1, " COMMON_FIELDS

Test(param_ckpt, a_well_formed_description_is_read) {
  char msg[256];
  cr_assert_eq(read_with("{\"w\": {" ADAMW_FIELDS "\"state\": [\"a\", \"b\"]}}", msg,
                         sizeof msg), 0, "%s", msg);
}

Test(param_ckpt, malformed_descriptions_are_refused_naming_file_and_parameter) {
  static const struct {
    const char *meta, *want;
  } cases[] = {
      {"[1, 2]", "is not a JSON object"},
      {"{\"w\": {\"optimizer\": \"adamw\"}}", "'w' has a malformed configuration"},
      {"{\"w\": {" ADAMW_FIELDS "\"state\": \"a\"}}", "'w' has a malformed configuration"},
      {"{\"w\": {\"optimizer\": \"lion\", \"lr\": 0.1, " COMMON_FIELDS "\"state\": []}}",
       "'w' has a malformed configuration"},
      {"{\"w\": {" ADAMW_FIELDS "\"state\": [\"a\"]}}", "'w' has the wrong number of buffers"},
      {"{\"w\": {" ADAMW_FIELDS "\"state\": [\"a\", \"zz\"]}}", "'w' names a buffer the file lacks"},
      {"{\"w\": {" ADAMW_FIELDS "\"state\": [\"a\", 5]}}", "'w' names a buffer the file lacks"},
      {"{\"w\": {" ADAMW_FIELDS "\"state\": [\"a\", \"c\"]}}", "'w' is not shaped as its piece"},
      {"{\"w\": {\"optimizer\": \"adamw\", \"lr\": -1, " COMMON_FIELDS
       "\"state\": [\"a\", \"b\"]}}", "lr"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char msg[256];
    cr_assert_neq(read_with(cases[i].meta, msg, sizeof msg), 0, "%s", cases[i].meta);
    cr_assert(strstr(msg, cases[i].want) && strstr(msg, "rank0.c.safetensors"),
              "%s -> %s", cases[i].meta, msg);
  }
}

Test(param_ckpt, a_parameter_with_the_longest_name_is_saved_and_read) {
  char name[DISTD_NAME_MAX];
  memset(name, 'n', sizeof name - 1);
  name[sizeof name - 1] = 0;
  distd_tensor *t = NULL;
  cr_assert_eq(distd_tensor_new(st, name, DIST_FLOAT32, &w->global, &w->mesh,
                                w->placements, 0, &t, NULL), 0);
  cr_assert_eq(distd_store_put(st, t, 0, NULL), 0);
  distd_params *p = distd_params_new(0);
  distd_param_cfg cfg = adamw_cfg();
  distd_param_entry *e = NULL;
  cr_assert_eq(distd_param_prepare(st, t, &cfg, 1, NULL, &e, NULL), 0);
  distd_param_install(p, e);
  size_t len = 0;
  void *bytes = encode(p, &t, 1, &len);
  dist_st_file *f = NULL;
  cr_assert_eq(dist_st_parse(bytes, len, &f, NULL), 0);
  cr_assert_eq(distd_ckpt_params_read(f, "r", st, &t, 1, &e, NULL), 0);
  cr_assert_not_null(e);
  distd_param_entry_free(e);
  dist_st_free(f);
  free(bytes);
  distd_tensor_unref(t);
  distd_params_free(p);
}

/* Each of jansson's allocations failing in turn while a rank lists what
 * it will write: DIST_ENOMEM, or a description that names the parameter
 * with both state buffers. It wrote a description without the parameter
 * (a checkpoint that restored w without its optimizer state), or none. */
Test(param_ckpt, a_description_jansson_cannot_allocate_for_is_an_error_never_a_short_one) {
  distd_params *p = params_with_w();
  distd_param_snapshot snap;
  cr_assert_eq(distd_param_snapshot_take(p, st, "w", &snap, NULL), 0);
  long k = 0, counted = 0;
  for (int clean = 0; !clean && k < 10000;) { /* until a run ends before its k-th */
    k++;
    distd_ckpt_contents cc;
    dist_errbuf eb = DIST_ERRBUF_INIT;
    jansson_fail_from_now(k);
    int rc = distd_ckpt_contents_build(&w, &snap, 1, &cc, &eb);
    counted = jansson_restore();
    if (rc != 0) {
      cr_assert_eq(rc, DIST_ENOMEM, "k=%ld: %s", k, eb.msg);
      continue;
    }
    clean = counted < k;
    json_t *d = cc.optim_json ? json_loads(cc.optim_json, 0, NULL) : NULL;
    cr_assert_not_null(d, "k=%ld: no description: %s", k, cc.optim_json);
    json_t *state = json_object_get(json_object_get(d, "w"), "state");
    cr_assert_eq(json_array_size(state), 2, "k=%ld: %s", k, cc.optim_json);
    json_decref(d);
    distd_ckpt_contents_free(&cc);
  }
  cr_assert_gt(k, 3, "jansson allocated only %ld times", counted);
  cr_assert_lt(k, 10000);
  distd_param_snapshot_free(&snap);
  distd_params_free(p);
}

/* Each of jansson's allocations failing in turn while a rank reads a
 * parameter back: DIST_ENOMEM, or the parameter with its step. It read
 * as a malformed description (EINVAL) when jansson could not unpack. */
Test(param_ckpt, a_description_jansson_cannot_allocate_to_read_is_out_of_memory) {
  distd_params *p = params_with_w();
  void *bytes = NULL;
  dist_st_file *f = w_file(p, &bytes);
  long k = 0, counted = 0;
  for (int clean = 0; !clean && k < 10000;) { /* until a run ends before its k-th */
    k++;
    distd_param_entry *e = NULL;
    dist_errbuf eb = DIST_ERRBUF_INIT;
    jansson_fail_from_now(k);
    int rc = distd_ckpt_params_read(f, "rank0.x.safetensors", st, &w, 1, &e, &eb);
    counted = jansson_restore();
    clean = counted < k;
    cr_assert(rc == 0 || !clean, "k=%ld: failed with nothing failing: %s", k, eb.msg);
    if (rc != 0) {
      cr_assert_eq(rc, DIST_ENOMEM, "k=%ld: %s", k, eb.msg);
      continue;
    }
    cr_assert_not_null(e, "k=%ld: w read back without its optimizer state", k);
    distd_params *q = distd_params_new(0);
    distd_param_install(q, e);
    distd_params_free(q);
  }
  cr_assert_gt(k, 3);
  cr_assert_lt(k, 10000);
  dist_st_free(f);
  free(bytes);
  distd_params_free(p);
}
