/* The MoE layer from the trainer's side (dist.h "MoE layer"): the gate and
 * the combine run here, in double precision; the routed rows travel daemon
 * to daemon (global_scatter / global_gather) and the experts run in the
 * daemons (moe.proto ExpertForward / ExpertBackward).
 *
 * Scatter order: the rows sent by one rank are its (token, slot) pairs
 * sorted by global expert id, then token, then slot, so chunk i of the
 * scatter input is exactly what goes to expert i. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "moe.pb-c.h"

#define LAYER_NAME_MAX 150
#define INVOCATION 1 /* one step in flight per layer: each forward replaces it */

/* What one participating rank's forward keeps for its backward. */
typedef struct part {
  int64_t T;        /* tokens */
  double *x;        /* [T, d_model] */
  int *sel;         /* [T, K] global expert ids */
  double *gw;       /* [T, K] gate weights */
  int64_t *row;     /* [T, K] row of slot (t, j) in the scatter input */
  int64_t *lc, *gc; /* local / global counts, NE each */
  double *o;        /* [T*K, d_model] expert outputs, scatter-input order */
} part;

struct dist_moe_layer {
  char name[LAYER_NAME_MAX + 1];
  int E, W, K, NE, bias;
  int64_t dm, dh;
  dist_dtype dt;
  dist_expert_act act;
  int group[DIST_MAX_MESH_RANKS]; /* global ranks in group order */
  int pos[DIST_MAX_MESH_RANKS];   /* group positions this client drives */
  int n;                          /* how many: 1 (SPMD) or W */
  int have_grads;                 /* the next backward accumulates */
  int forwarded;                  /* parts hold a forward */
  double *gate;                   /* [d_model, NE] of the last forward */
  part *parts;                    /* n */
};

static void part_clear(part *p) {
  free(p->x), free(p->sel), free(p->gw), free(p->row);
  free(p->lc), free(p->gc), free(p->o);
  memset(p, 0, sizeof *p);
}

void dist_moe_layer_free(dist_moe_layer *l) {
  if (!l) return;
  for (int k = 0; l->parts && k < l->n; k++) part_clear(&l->parts[k]);
  free(l->parts);
  free(l->gate);
  free(l);
}

static void to_double(const void *src, dist_dtype dt, double *dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = dist_elem_get(src, dt, i);
}

static void *from_double(const double *src, dist_dtype dt, size_t n) {
  void *out = malloc(n * dist_dtype_size(dt) + 1);
  for (size_t i = 0; out && i < n; i++) dist_elem_set(out, dt, i, src[i]);
  return out;
}

static void tensor_name(char *buf, size_t len, const dist_moe_layer *l,
                        const char *what) {
  snprintf(buf, len, "%s.moe_%s", l->name, what);
}

/* ---------------------------------------------------------------- create */

static int check_opts(dist_client *c, const char *name,
                      const dist_moe_layer_opts *o) {
  if (!name || !name[0] || strlen(name) > LAYER_NAME_MAX)
    return dist_client_fail(c, DIST_EINVAL, "a MoE layer name has 1 to %d "
                            "characters", LAYER_NAME_MAX);
  if (o->experts_per_rank < 1 || o->d_model < 1 || o->d_hidden < 1 || o->top_k < 1)
    return dist_client_fail(c, DIST_EINVAL, "MoE layer '%s': experts_per_rank, "
                            "d_model, d_hidden and top_k must be positive", name);
  if (o->dtype != DIST_FLOAT32 && o->dtype != DIST_FLOAT64)
    return dist_client_fail(c, DIST_ENOTSUP, "MoE layer '%s': dtype %s; experts "
                            "are float32 or float64", name, dist_dtype_name(o->dtype));
  if (o->activation != DIST_EXPERT_GELU && o->activation != DIST_EXPERT_SILU)
    return dist_client_fail(c, DIST_EINVAL, "MoE layer '%s': unknown activation %d",
                            name, (int)o->activation);
  return 0;
}

/* The group and the positions this client drives (as dist_global_scatter
 * resolves them): none for an SPMD trainer outside the group, whose layer
 * is empty (see outsider_pass). */
static int resolve(dist_client *c, dist_moe_layer *l, const int *group, int size) {
  l->W = group ? size : c->n;
  if (l->W < 1 || l->W > DIST_MAX_MESH_RANKS)
    return dist_client_fail(c, DIST_EINVAL, "group of %d ranks", l->W);
  for (int i = 0; i < l->W; i++) {
    l->group[i] = group ? group[i] : dist_reached_rank(c, i);
    if (!dist_client_reaches(c, l->group[i]))
      return dist_refuse_unreached(c, "group", l->group[i], "group names rank %d, but the "
                                   "cluster has %d daemons", l->group[i], c->n);
    if (c->spmd_rank < 0) l->pos[l->n++] = i;
    else if (l->group[i] == c->spmd_rank) l->pos[0] = i, l->n = 1;
  }
  return 0;
}

static void fill_weights(const dist_moe_layer *l, const dist_expert_weights *w,
                         Dist__V1__ExpertWeights *pb) {
  size_t esz = dist_dtype_size(l->dt);
  dist__v1__expert_weights__init(pb);
  pb->w1 = (ProtobufCBinaryData){(size_t)(l->dm * l->dh) * esz, (uint8_t *)w->w1};
  pb->w2 = (ProtobufCBinaryData){(size_t)(l->dh * l->dm) * esz, (uint8_t *)w->w2};
  if (l->bias) {
    pb->b1 = (ProtobufCBinaryData){(size_t)l->dh * esz, (uint8_t *)w->b1};
    pb->b2 = (ProtobufCBinaryData){(size_t)l->dm * esz, (uint8_t *)w->b2};
  }
}

/* After a failed create, deletes the experts (and their gradients) that
 * the daemons answering success made: the caller gets no layer to name
 * them by. Not after a create that replaced: those names were the
 * caller's before. A delete that fails is not noted for later: the names
 * follow the layer's, the caller's, who may create it again. */
static void undo_create(dist_client *c, const dist_moe_layer *l, const dist_call *calls) {
  static const char *const which[4] = {"w1", "b1", "w2", "b2"};
  char name[256], grad[300];
  for (int k = 0; k < l->n; k++) {
    if (!calls[k].applied) continue;
    for (int e = l->pos[k] * l->E; e < (l->pos[k] + 1) * l->E; e++)
      for (int w = 0; w < 4; w++) {
        if (dist_moe_layer_param_name(l, e, which[w], name, sizeof name) != 0) continue;
        snprintf(grad, sizeof grad, "%s.grad", name);
        dist_delete_on(c, name, &calls[k].target, 1, NULL);
        dist_delete_on(c, grad, &calls[k].target, 1, NULL);
      }
  }
}

/* One create request per driven position, under op_id; weights (may be
 * NULL) has n*E entries. */
static int create_experts(dist_client *c, dist_moe_layer *l,
                          const dist_moe_layer_opts *o, uint64_t op_id) {
  Dist__V1__ExpertLayerCreateRequest *rq = calloc((size_t)l->n, sizeof *rq);
  Dist__V1__ExpertWeights *w = calloc((size_t)(l->n * l->E) + 1, sizeof *w);
  Dist__V1__ExpertWeights **wp = calloc((size_t)(l->n * l->E) + 1, sizeof *wp);
  dist_call *calls = calloc((size_t)l->n, sizeof *calls);
  int rc;
  if (!rq || !w || !wp || !calls) {
    rc = dist_client_fail(c, DIST_ENOMEM, "out of memory");
    goto out;
  }
  /* Every daemon of the group, so that they create the layer all or none. */
  uint32_t ranks[DIST_MAX_MESH_RANKS];
  for (int i = 0; i < l->W; i++) ranks[i] = (uint32_t)l->group[i];
  for (int k = 0; k < l->n; k++) {
    dist__v1__expert_layer_create_request__init(&rq[k]);
    rq[k].op_id = op_id;
    rq[k].n_ranks = (size_t)l->W;
    rq[k].ranks = ranks;
    rq[k].layer = l->name;
    rq[k].experts = (uint32_t)l->E;
    rq[k].first_expert = (uint32_t)(l->pos[k] * l->E);
    rq[k].d_model = (uint64_t)l->dm;
    rq[k].d_hidden = (uint64_t)l->dh;
    rq[k].activation = (Dist__V1__ExpertActivation)l->act;
    rq[k].bias = l->bias;
    rq[k].dtype = (Dist__V1__DType)l->dt;
    rq[k].seed = o->seed;
    rq[k].replace = o->replace;
    for (int e = 0; o->weights && e < l->E; e++) {
      int i = k * l->E + e;
      fill_weights(l, &o->weights[c->spmd_rank < 0 ? l->pos[k] * l->E + e : e], &w[i]);
      wp[i] = &w[i];
    }
    if (o->weights) rq[k].n_weights = (size_t)l->E, rq[k].weights = &wp[k * l->E];
    calls[k] = (dist_call){l->group[l->pos[k]], &rq[k].base, NULL, DIST_ERRBUF_INIT, 0, 0};
  }
  rc = dist_call_many(c, "/dist.v1.Moe/ExpertLayerCreate",
                      &dist__v1__expert_layer_create_reply__descriptor, calls, l->n);
  if (rc != 0 && !o->replace) undo_create(c, l, calls);
  dist_calls_free(calls, l->n);
out:
  free(calls), free(wp), free(w), free(rq);
  return rc;
}

/* check_opts, then l's shape from o, and its top_k against its experts. */
static int check_layer(dist_client *c, const char *name, const dist_moe_layer_opts *o,
                       dist_moe_layer *l) {
  int rc = check_opts(c, name, o);
  if (rc != 0) return rc;
  snprintf(l->name, sizeof l->name, "%s", name);
  l->E = o->experts_per_rank, l->K = o->top_k, l->bias = o->bias != 0;
  l->dm = o->d_model, l->dh = o->d_hidden, l->dt = o->dtype, l->act = o->activation;
  l->NE = l->W * l->E;
  if (l->K > l->NE)
    return dist_client_fail(c, DIST_EINVAL, "MoE layer '%s': top_k %d is more than "
                            "the %d experts", name, l->K, l->NE);
  return 0;
}

/* dist_spmd_refused to the layer's group. */
static void refuse_layer(dist_client *c, const dist_moe_layer *l, uint64_t op_id) {
  dist_spmd_refused_group(c, op_id, l->group, l->W);
}

int dist_moe_layer_create(dist_client *c, const char *name,
                          const dist_moe_layer_opts *opts,
                          dist_moe_layer **out) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, out)) return c->err.code;
  dist_moe_layer_opts def = DIST_MOE_LAYER_OPTS_INIT;
  const dist_moe_layer_opts *o = opts ? opts : &def;
  *out = NULL;
  /* The group's daemons create it under this op id. Taken before the
   * checks, and by every trainer, in the group or not: a trainer that
   * refuses the layer stays in step with the others, and tells them. */
  uint64_t op_id = dist_next_op_id(c);
  dist_moe_layer *l = calloc(1, sizeof *l);
  if (!l) {
    dist_client_fail(c, DIST_ENOMEM, "out of memory");
    return dist_spmd_refused_group(c, op_id, o->group, o->group_size);
  }
  int rc = resolve(c, l, o->group, o->group_size);
  if (rc != 0) {
    dist_spmd_refused_group(c, op_id, o->group, o->group_size);
    goto fail;
  }
  if ((rc = check_layer(c, name, o, l)) != 0) {
    refuse_layer(c, l, op_id);
    goto fail;
  }
  l->parts = calloc((size_t)l->n + 1, sizeof *l->parts);
  l->gate = calloc((size_t)(l->dm * l->NE), sizeof *l->gate);
  if (!l->parts || !l->gate) {
    rc = dist_client_fail(c, DIST_ENOMEM, "out of memory");
    goto fail;
  }
  /* An outsider's daemon holds none of the layer's experts. */
  if (l->n > 0 && (rc = create_experts(c, l, o, op_id)) != 0) goto fail;
  *out = l;
  return 0;
fail:
  dist_moe_layer_free(l);
  return rc;
}

/* ---------------------------------------------------------------- the gate */

/* Top-k of token t's logits (ties: lower id first) and the softmax over the
 * selected ones. */
static void gate_token(const dist_moe_layer *l, const double *logits, int *sel,
                       double *gw) {
  for (int j = 0; j < l->K; j++) {
    int best = -1;
    for (int e = 0; e < l->NE; e++) {
      int taken = 0;
      for (int i = 0; i < j; i++) taken |= sel[i] == e;
      if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
    }
    sel[j] = best;
  }
  double m = logits[sel[0]], sum = 0;
  for (int j = 0; j < l->K; j++) sum += gw[j] = exp(logits[sel[j]] - m);
  for (int j = 0; j < l->K; j++) gw[j] /= sum;
}

static int part_alloc(part *p, const dist_moe_layer *l, int64_t T) {
  size_t slots = (size_t)T * (size_t)l->K + 1;
  p->T = T;
  p->x = malloc(((size_t)(T * l->dm) + 1) * sizeof *p->x);
  p->sel = malloc(slots * sizeof *p->sel);
  p->gw = malloc(slots * sizeof *p->gw);
  p->row = malloc(slots * sizeof *p->row);
  p->lc = calloc((size_t)l->NE, sizeof *p->lc);
  p->gc = calloc((size_t)l->NE, sizeof *p->gc);
  return p->x && p->sel && p->gw && p->row && p->lc && p->gc ? 0 : DIST_ENOMEM;
}

/* Gates rank part p's tokens: sel, gw, local counts and each slot's row in
 * the scatter input. */
static int gate_part(const dist_moe_layer *l, part *p) {
  double *logits = malloc((size_t)l->NE * sizeof *logits);
  int64_t *next = calloc((size_t)l->NE, sizeof *next);
  if (!logits || !next) {
    free(logits), free(next);
    return DIST_ENOMEM;
  }
  for (int64_t t = 0; t < p->T; t++) {
    for (int e = 0; e < l->NE; e++) {
      double s = 0;
      for (int64_t d = 0; d < l->dm; d++) s += p->x[t * l->dm + d] * l->gate[d * l->NE + e];
      logits[e] = s;
    }
    gate_token(l, logits, p->sel + t * l->K, p->gw + t * l->K);
    for (int j = 0; j < l->K; j++) p->lc[p->sel[t * l->K + j]]++;
  }
  for (int e = 0, start = 0; e < l->NE; start += (int)p->lc[e++]) next[e] = start;
  for (int64_t i = 0; i < p->T * l->K; i++) p->row[i] = next[p->sel[i]]++;
  free(logits), free(next);
  return 0;
}

/* The scatter input of part p: row p->row[t*K+j] is x_t, in dtype. */
static void *routed_rows(const dist_moe_layer *l, const part *p) {
  size_t esz = dist_dtype_size(l->dt), n = (size_t)(p->T * l->K);
  char *rows = malloc(n * (size_t)l->dm * esz + 1);
  for (size_t i = 0; rows && i < n; i++)
    for (int64_t d = 0; d < l->dm; d++)
      dist_elem_set(rows, l->dt, (size_t)(p->row[i] * l->dm + d),
                    p->x[(int64_t)(i / (size_t)l->K) * l->dm + d]);
  return rows;
}

/* ---------------------------------------------------------------- daemon calls */

/* ExpertForward (backward 0) or ExpertBackward on every driven daemon. */
static int run_experts(dist_client *c, dist_moe_layer *l, int backward) {
  char xname[256], yname[256];
  tensor_name(xname, sizeof xname, l, backward ? "dy" : "x");
  tensor_name(yname, sizeof yname, l, backward ? "dx" : "y");
  Dist__V1__ExpertForwardRequest *fr = calloc((size_t)l->n, sizeof *fr);
  Dist__V1__ExpertBackwardRequest *br = calloc((size_t)l->n, sizeof *br);
  dist_call *calls = calloc((size_t)l->n, sizeof *calls);
  int rc;
  if (!fr || !br || !calls) {
    rc = dist_client_fail(c, DIST_ENOMEM, "out of memory");
    goto out;
  }
  for (int k = 0; k < l->n; k++) {
    ProtobufCMessage *m;
    if (backward) {
      dist__v1__expert_backward_request__init(&br[k]);
      br[k].layer = l->name, br[k].invocation = INVOCATION;
      br[k].grad_name = xname, br[k].out_name = yname;
      br[k].replace = 1, br[k].accumulate = l->have_grads;
      m = &br[k].base;
    } else {
      dist__v1__expert_forward_request__init(&fr[k]);
      fr[k].layer = l->name, fr[k].x_name = xname, fr[k].out_name = yname;
      fr[k].n_counts = (size_t)l->NE, fr[k].counts = l->parts[k].gc;
      fr[k].replace = 1, fr[k].invocation = INVOCATION;
      m = &fr[k].base;
    }
    calls[k] = (dist_call){l->group[l->pos[k]], m, NULL, DIST_ERRBUF_INIT, 0, 0};
  }
  rc = backward ? dist_call_many(c, "/dist.v1.Moe/ExpertBackward",
                                 &dist__v1__expert_backward_reply__descriptor, calls, l->n)
                : dist_call_many(c, "/dist.v1.Moe/ExpertForward",
                                 &dist__v1__expert_forward_reply__descriptor, calls, l->n);
  dist_calls_free(calls, l->n);
out:
  free(calls), free(br), free(fr);
  return rc;
}

/* The counts arrays of the parts, as dist_global_scatter takes them. */
static void count_arrays(const dist_moe_layer *l, const int64_t **lc,
                         const int64_t **gc, int64_t **gc_out) {
  for (int k = 0; k < l->n; k++) {
    lc[k] = l->parts[k].lc;
    if (gc) gc[k] = l->parts[k].gc;
    if (gc_out) gc_out[k] = l->parts[k].gc;
  }
}

/* c->err's code after this trainer refused a forward or backward of l
 * before its first exchange: the group's other daemons fail that exchange
 * under its op id, and their trainers skip the rest of the pass as this
 * one does, so that all stay in step. */
static int refuse_pass(dist_client *c, const dist_moe_layer *l) {
  refuse_layer(c, l, dist_next_op_id(c));
  return c->err.code;
}

/* Scatter rows[k] (kept as "<layer>.moe_<into>"), run the experts, gather
 * "<layer>.moe_<from>" back: out[k] gets the gathered rows. */
static int exchange_and_run(dist_client *c, dist_moe_layer *l, void **rows,
                            int backward, void **out) {
  const int64_t *lc[DIST_MAX_MESH_RANKS], *gc[DIST_MAX_MESH_RANKS];
  char into[256], from[256];
  tensor_name(into, sizeof into, l, backward ? "dy" : "x");
  tensor_name(from, sizeof from, l, backward ? "dx" : "y");
  count_arrays(l, lc, gc, NULL);
  dist_moe_opts so = {NULL, into, 1, backward}, go = {from, NULL, 0, backward};
  int rc = dist_global_scatter(c, (const void *const *)rows, NULL, l->dt, l->dm,
                               lc, gc, l->E, l->group, l->W, &so, NULL, NULL);
  /* Experts its daemon refused to run: the others wait in the gather that
   * follows, so it is refused to them, under the op id it would take. */
  if (rc == 0 && run_experts(c, l, backward) != 0) return refuse_pass(c, l);
  if (rc == 0)
    rc = dist_global_gather(c, NULL, NULL, l->dt, l->dm, lc, gc, l->E, l->group,
                            l->W, &go, out, NULL);
  return rc;
}

/* ---------------------------------------------------------------- forward */

static void free_rows(void **rows, int n) {
  for (int k = 0; k < n; k++) free(rows[k]), rows[k] = NULL;
}


/* Gates every part. */
static int gate_parts(dist_client *c, dist_moe_layer *l, const void *const *x,
                      const int64_t *tokens) {
  for (int k = 0; k < l->n; k++) {
    part *p = &l->parts[k];
    part_clear(p);
    if (tokens[k] < 0 || (tokens[k] && !x[k]))
      return dist_client_fail(c, DIST_EINVAL, "MoE layer '%s': rank %d has %lld "
                              "tokens", l->name, l->group[l->pos[k]], (long long)tokens[k]);
    if (part_alloc(p, l, tokens[k]) != 0)
      return dist_client_fail(c, DIST_ENOMEM, "out of memory");
    to_double(x[k], l->dt, p->x, (size_t)(tokens[k] * l->dm));
    if (gate_part(l, p) != 0) return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  }
  return 0;
}

/* Gates every part and derives the global counts. */
static int route(dist_client *c, dist_moe_layer *l, const void *const *x,
                 const int64_t *tokens) {
  const int64_t *lc[DIST_MAX_MESH_RANKS];
  int64_t *gc[DIST_MAX_MESH_RANKS];
  if (gate_parts(c, l, x, tokens) != 0) return refuse_pass(c, l);
  count_arrays(l, lc, NULL, gc);
  return dist_count_global(c, lc, l->E, l->group, l->W, gc);
}

/* y_t = sum_j gw[t,j] * o[row(t,j)]. */
static void *combine(const dist_moe_layer *l, const part *p) {
  double *y = calloc((size_t)(p->T * l->dm) + 1, sizeof *y);
  for (int64_t i = 0; y && i < p->T * l->K; i++) {
    const double *o = p->o + p->row[i] * l->dm;
    double *yt = y + (i / l->K) * l->dm;
    for (int64_t d = 0; d < l->dm; d++) yt[d] += p->gw[i] * o[d];
  }
  void *out = y ? from_double(y, l->dt, (size_t)(p->T * l->dm)) : NULL;
  free(y);
  return out;
}

/* Entry by entry, before anything is sent: rows[k] for each rank this
 * client speaks for that has tokens (tokens[k] in forward, the forward's
 * count in backward). A negative count is gate_parts' to refuse. */
static int check_rows(dist_client *c, const dist_moe_layer *l, const char *func,
                      const char *arr, const void *const *rows, const int64_t *tokens) {
  for (int k = 0; k < l->n; k++) {
    int64_t t = tokens ? tokens[k] : l->parts[k].T;
    if (t > 0 && !rows[k])
      return dist_client_fail(c, DIST_EINVAL, "%s: %s[%d] is NULL (rank %d has %lld tokens)",
                              func, arr, k, l->group[l->pos[k]], (long long)t);
  }
  return 0;
}

/* The op ids a member's pass takes when it runs: a forward's
 * count_global, then each pass's scatter and gather. */
#define FORWARD_IDS 3
#define BACKWARD_IDS 2

/* The pass of an SPMD trainer outside the layer's group (l->n 0): it
 * holds no expert and routes no token, so the pass is a no-op, as a
 * Paddle layer is for a rank outside its group, giving an empty out[0]
 * (malloc'd, to free() as a member's). Its ids are whole_pass's to take:
 * nobody waits for it, so it cannot tell anyone when it refuses. */
static int outsider_pass(dist_client *c, void **out) {
  if (out) return dist_empty_result(c, &out[0]);
  c->err = (dist_errbuf)DIST_ERRBUF_INIT;
  return 0;
}

/* A member's forward, its arguments given; it may stop before its last
 * exchange (refused or failed), taking fewer than FORWARD_IDS. */
static int member_forward(dist_client *c, dist_moe_layer *l, const void *const *x,
                          const int64_t *tokens, const void *gate_w, void **y) {
  void *rows[DIST_MAX_MESH_RANKS] = {0}, *outs[DIST_MAX_MESH_RANKS] = {0};
  if (check_rows(c, l, "dist_moe_layer_forward", "x", x, tokens)) return refuse_pass(c, l);
  to_double(gate_w, l->dt, l->gate, (size_t)(l->dm * l->NE));
  int rc = route(c, l, x, tokens);
  for (int k = 0; rc == 0 && k < l->n; k++)
    if (!(rows[k] = routed_rows(l, &l->parts[k])))
      rc = dist_client_fail(c, DIST_ENOMEM, "out of memory");
  if (rc == 0) rc = exchange_and_run(c, l, rows, 0, outs);
  for (int k = 0; rc == 0 && k < l->n; k++) {
    part *p = &l->parts[k];
    size_t n = (size_t)(p->T * l->K * l->dm);
    if (!(p->o = malloc(n * sizeof *p->o + 1)))
      rc = dist_client_fail(c, DIST_ENOMEM, "out of memory");
    else
      to_double(outs[k], l->dt, p->o, n);
  }
  for (int k = 0; rc == 0 && k < l->n; k++)
    if (!(y[k] = combine(l, &l->parts[k]))) {
      free_rows(y, k);
      rc = dist_client_fail(c, DIST_ENOMEM, "out of memory");
    }
  free_rows(rows, l->n);
  free_rows(outs, l->n);
  return rc;
}

/* A pass takes its ids on every SPMD trainer whatever happens in it: the
 * members stop at the same step when one refuses or fails (the others
 * fail that step's exchange), but a trainer outside the group cannot
 * learn of it, and takes them all. */
static int whole_pass(dist_client *c, uint64_t first, int ids, int rc) {
  if (c->spmd_rank >= 0) dist_take_ids_through(c, first + (uint64_t)ids - 1);
  return rc;
}

int dist_moe_layer_forward(dist_client *c, dist_moe_layer *l,
                           const void *const *x, const int64_t *tokens,
                           const void *gate_w, void **y) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, l)) return c->err.code;
  l->forwarded = 0;
  uint64_t first = dist_last_op_id(c) + 1;
  int rc;
  if (!x || !tokens || !gate_w || !y) {
    dist_client_fail(c, DIST_EINVAL, "MoE layer '%s': forward needs x, tokens, gate_w "
                     "and y", l->name);
    rc = l->n ? refuse_pass(c, l) : c->err.code;
  } else {
    rc = l->n ? member_forward(c, l, x, tokens, gate_w, y) : outsider_pass(c, y);
  }
  l->forwarded = rc == 0;
  return whole_pass(c, first, FORWARD_IDS, rc);
}

/* ---------------------------------------------------------------- backward */

/* Part p's gradient rows for the experts' outputs (gw * dy_t at row(t,j))
 * and dgw[t,j] = dy_t . o[row(t,j)]. */
static void *output_grads(const dist_moe_layer *l, const part *p,
                          const double *dy, double *dgw) {
  char *rows = malloc((size_t)(p->T * l->K * l->dm) * dist_dtype_size(l->dt) + 1);
  for (int64_t i = 0; rows && i < p->T * l->K; i++) {
    const double *g = dy + (i / l->K) * l->dm, *o = p->o + p->row[i] * l->dm;
    double dot = 0;
    for (int64_t d = 0; d < l->dm; d++) {
      dist_elem_set(rows, l->dt, (size_t)(p->row[i] * l->dm + d), p->gw[i] * g[d]);
      dot += g[d] * o[d];
    }
    dgw[i] = dot;
  }
  return rows;
}

/* Through the gate: dlogit[sel_j] = gw_j (dgw_j - sum_i gw_i dgw_i); then
 * dx_t += dlogit @ gate^T and dgate += x_t^T dlogit. */
static void gate_backward(const dist_moe_layer *l, const part *p,
                          const double *dgw, double *dx, double *dgate) {
  for (int64_t t = 0; t < p->T; t++) {
    const double *gw = p->gw + t * l->K, *g = dgw + t * l->K;
    const int *sel = p->sel + t * l->K;
    double dot = 0;
    for (int j = 0; j < l->K; j++) dot += gw[j] * g[j];
    for (int j = 0; j < l->K; j++) {
      double dl = gw[j] * (g[j] - dot);
      for (int64_t d = 0; d < l->dm; d++) {
        dx[t * l->dm + d] += dl * l->gate[d * l->NE + sel[j]];
        if (dgate) dgate[d * l->NE + sel[j]] += dl * p->x[t * l->dm + d];
      }
    }
  }
}

/* dx_t = sum_j expert_dx[row(t,j)] + the gate's part. */
static void *input_grad(const dist_moe_layer *l, const part *p,
                        const void *expert_dx, const double *dgw, double *dgate) {
  double *dx = calloc((size_t)(p->T * l->dm) + 1, sizeof *dx);
  for (int64_t i = 0; dx && i < p->T * l->K; i++)
    for (int64_t d = 0; d < l->dm; d++)
      dx[(i / l->K) * l->dm + d] +=
          dist_elem_get(expert_dx, l->dt, (size_t)(p->row[i] * l->dm + d));
  if (dx) gate_backward(l, p, dgw, dx, dgate);
  void *out = dx ? from_double(dx, l->dt, (size_t)(p->T * l->dm)) : NULL;
  free(dx);
  return out;
}

static int backward_parts(dist_client *c, dist_moe_layer *l,
                          const void *const *grad_y, void **rows, double **dgw) {
  for (int k = 0; k < l->n; k++) {
    part *p = &l->parts[k];
    double *dy = malloc((size_t)(p->T * l->dm) * sizeof *dy + 1);
    dgw[k] = malloc((size_t)(p->T * l->K) * sizeof **dgw + 1);
    if (dy && dgw[k] && (p->T == 0 || grad_y[k])) {
      to_double(grad_y[k], l->dt, dy, (size_t)(p->T * l->dm));
      rows[k] = output_grads(l, p, dy, dgw[k]);
    }
    free(dy);
    if (!rows[k])
      return dist_client_fail(c, DIST_ENOMEM, "out of memory or no grad_y for "
                              "rank %d", l->group[l->pos[k]]);
  }
  return 0;
}

static int outsider_backward(dist_client *c, dist_moe_layer *l, int refused,
                             void **grad_x, void *grad_gate) {
  if (refused) return c->err.code;
  int rc = outsider_pass(c, grad_x);
  if (rc == 0 && grad_gate)
    memset(grad_gate, 0, (size_t)(l->dm * l->NE) * dist_dtype_size(l->dt));
  if (rc == 0) l->have_grads = 1, l->forwarded = 0;
  return rc;
}

static int backward_pass(dist_client *c, dist_moe_layer *l, const void *const *grad_y,
                         void **grad_x, void *grad_gate) {
  void *rows[DIST_MAX_MESH_RANKS] = {0}, *dxs[DIST_MAX_MESH_RANKS] = {0};
  double *dgw[DIST_MAX_MESH_RANKS] = {0}, *dgate = NULL;
  int bad = !l->forwarded || !grad_y;
  if (bad)
    dist_client_fail(c, DIST_EINVAL, "MoE layer '%s': backward needs grad_y and a "
                     "forward first (one backward per forward)", l->name);
  if (l->n == 0) /* no token of its own: its gate's gradient is 0 */
    return outsider_backward(c, l, bad, grad_x, grad_gate);
  if (bad) return refuse_pass(c, l);
  if (check_rows(c, l, "dist_moe_layer_backward", "grad_y", grad_y, NULL))
    return refuse_pass(c, l);
  int rc = backward_parts(c, l, grad_y, rows, dgw);
  if (rc != 0) refuse_pass(c, l);
  if (rc == 0) rc = exchange_and_run(c, l, rows, 1, dxs);
  if (rc == 0) l->have_grads = 1, l->forwarded = 0;
  if (rc == 0 && grad_gate &&
      !(dgate = calloc((size_t)(l->dm * l->NE), sizeof *dgate)))
    rc = dist_client_fail(c, DIST_ENOMEM, "out of memory");
  for (int k = 0; rc == 0 && k < l->n; k++) {
    void *dx = input_grad(l, &l->parts[k], dxs[k], dgw[k], dgate);
    if (!dx) rc = dist_client_fail(c, DIST_ENOMEM, "out of memory");
    else if (grad_x) grad_x[k] = dx;
    else free(dx);
  }
  if (rc != 0 && grad_x) free_rows(grad_x, l->n);
  if (rc == 0 && dgate)
    for (int64_t i = 0; i < l->dm * l->NE; i++) dist_elem_set(grad_gate, l->dt, (size_t)i, dgate[i]);
  free(dgate);
  for (int k = 0; k < l->n; k++) free(dgw[k]);
  free_rows(rows, l->n);
  free_rows(dxs, l->n);
  return rc;
}

int dist_moe_layer_backward(dist_client *c, dist_moe_layer *l,
                            const void *const *grad_y, void **grad_x,
                            void *grad_gate) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, l)) return c->err.code;
  uint64_t first = dist_last_op_id(c) + 1;
  return whole_pass(c, first, BACKWARD_IDS, backward_pass(c, l, grad_y, grad_x, grad_gate));
}

/* ---------------------------------------------------------------- training */

void dist_moe_layer_zero_grad(dist_moe_layer *l) {
  if (!l) {
    dist_null_handle(__func__, "l");
    return;
  }
  l->have_grads = 0;
}

int dist_moe_layer_param_name(const dist_moe_layer *l, int expert,
                              const char *which, char *buf, size_t len) {
  if (!l) return dist_null_handle(__func__, "l"), -1;
  if (!buf && len) return dist_null_handle(__func__, "buf"), -1;
  int bias = which && (!strcmp(which, "b1") || !strcmp(which, "b2"));
  int weight = which && (!strcmp(which, "w1") || !strcmp(which, "w2"));
  if (expert < 0 || expert >= l->NE || (!weight && !(bias && l->bias))) return -1;
  int n = snprintf(buf, len, "%s.expert%d.%s", l->name, expert, which);
  return n < 0 || (size_t)n >= len ? -1 : 0;
}

/* Calls fn on every parameter of every expert this client drives. */
static int each_param(dist_client *c, dist_moe_layer *l,
                      int (*fn)(dist_client *, const char *, const void *),
                      const void *arg) {
  static const char *const which[4] = {"w1", "b1", "w2", "b2"};
  char name[256];
  for (int k = 0; k < l->n; k++)
    for (int e = l->pos[k] * l->E; e < (l->pos[k] + 1) * l->E; e++)
      for (int w = 0; w < 4; w++) {
        if (dist_moe_layer_param_name(l, e, which[w], name, sizeof name) != 0) continue;
        int rc = fn(c, name, arg);
        if (rc != 0) return rc;
      }
  return 0;
}

/* The names of the expert parameters this client drives and of their
 * gradients ("<param>.grad"). */
typedef struct {
  char (*names)[256], (*grads)[300];
  const char **name_ptrs, **grad_ptrs;
  int n, cap;
} expert_names;

static int list_one(dist_client *c, const char *name, const void *arg) {
  expert_names *s = (expert_names *)arg;
  if (s->n == s->cap)
    return dist_client_fail(c, DIST_EPROTO, "more expert parameters than counted");
  snprintf(s->names[s->n], sizeof s->names[s->n], "%s", name);
  snprintf(s->grads[s->n], sizeof s->grads[s->n], "%s.grad", name);
  s->name_ptrs[s->n] = s->names[s->n];
  s->grad_ptrs[s->n] = s->grads[s->n];
  s->n++;
  return 0;
}

static int count_one(dist_client *c, const char *name, const void *arg) {
  (void)c, (void)name;
  ++*(int *)arg;
  return 0;
}

static void expert_names_free(expert_names *s) {
  free(s->names), free(s->grads), free(s->name_ptrs), free(s->grad_ptrs);
}

static int expert_names_make(dist_client *c, dist_moe_layer *l, expert_names *s) {
  *s = (expert_names){0};
  each_param(c, l, count_one, &s->cap);
  s->names = calloc((size_t)s->cap + 1, sizeof *s->names);
  s->grads = calloc((size_t)s->cap + 1, sizeof *s->grads);
  s->name_ptrs = calloc((size_t)s->cap + 1, sizeof *s->name_ptrs);
  s->grad_ptrs = calloc((size_t)s->cap + 1, sizeof *s->grad_ptrs);
  if (!s->names || !s->grads || !s->name_ptrs || !s->grad_ptrs)
    return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  return each_param(c, l, list_one, s);
}

/* Every expert parameter this client drives configured (with one
 * trainer) as one batch, then stepped as one: by all of their daemons or
 * by none. */
int dist_moe_layer_configure_optimizer(dist_client *c, dist_moe_layer *l,
                                       const struct dist_param_opts *opts) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, l)) return c->err.code;
  dist_param_opts o = DIST_PARAM_OPTS_INIT;
  if (opts) o = *opts;
  o.trainers = 1;
  expert_names s;
  int rc = expert_names_make(c, l, &s);
  if (rc == 0) rc = dist_param_configure_named(c, __func__, s.n, s.name_ptrs, &o);
  expert_names_free(&s);
  return rc;
}

int dist_moe_layer_step(dist_client *c, dist_moe_layer *l) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, l)) return c->err.code;
  expert_names s;
  int rc = expert_names_make(c, l, &s);
  if (rc == 0) rc = dist_param_push_tensors(c, s.n, s.name_ptrs, s.grad_ptrs, 0);
  expert_names_free(&s);
  if (rc == 0) l->have_grads = 0;
  return rc;
}

int dist_moe_layer_release(dist_client *c, dist_moe_layer *l) {
  if (!c) return dist_no_client(__func__);
  if (DIST_NEED(c, l)) return c->err.code;
  Dist__V1__ExpertReleaseRequest rq = DIST__V1__EXPERT_RELEASE_REQUEST__INIT;
  rq.layer = l->name;
  rq.invocation = INVOCATION;
  l->forwarded = 0;
  if (l->n == 0) return 0; /* an outsider's daemon keeps nothing of the layer */
  dist_call *calls = calloc((size_t)l->n, sizeof *calls);
  if (!calls) return dist_client_fail(c, DIST_ENOMEM, "out of memory");
  for (int k = 0; k < l->n; k++)
    calls[k] = (dist_call){l->group[l->pos[k]], &rq.base, NULL, DIST_ERRBUF_INIT, 0, 0};
  int rc = dist_call_many(c, "/dist.v1.Moe/ExpertRelease",
                          &dist__v1__expert_release_reply__descriptor, calls, l->n);
  dist_calls_free(calls, l->n);
  free(calls);
  l->forwarded = 0;
  return rc;
}
