/* gRPC control plane: one completion-queue thread receives calls and hands
 * them to a pool of workers, which run the handler and send the reply. The
 * queue thread never blocks on a handler, so a collective waiting on its
 * peers does not stall other calls. */
#include "rpc.h"

#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "hash.h"
#include "log.h"
#include "dist/types.h"
#include "metrics.h"
#include "op_refuse.h"
#include "pbuf.h"
#include "peer.h"
#include "status.h"
#include "tls.h"

#define PREARMED_PER_METHOD 8
#define BYTES_WALK_DEPTH 8

/* Calls in progress per client, for max_inflight_per_client. */
typedef struct client_load {
  struct client_load *next;
  char key[96]; /* "token:<hash>" or "host:<address>" */
  int inflight;
} client_load;

typedef enum { TAG_NEW, TAG_DONE } tag_kind;

struct call_ctx;
typedef struct call_tag {
  struct call_ctx *ctx;
  tag_kind kind;
} call_tag;

typedef struct call_ctx {
  distd_rpc *rpc;
  int method; /* index into rpc->methods, -1 for an unregistered method */
  grpc_call *call;
  gpr_timespec deadline;
  grpc_metadata_array md;
  grpc_call_details details; /* unregistered calls only */
  grpc_byte_buffer *request;
  grpc_byte_buffer *reply;
  int cancelled; /* RECV_CLOSE_ON_SERVER result */
  char status_details[600];
  grpc_slice details_slice;
  double started;
  call_tag t_new, t_done;
  struct call_ctx *next; /* work queue link */
} call_ctx;

struct distd_rpc {
  distd_server *srv;
  grpc_server *server;
  grpc_completion_queue *cq;
  const distd_method *methods;
  int nmethods;
  void **handles;
  /* Calls of each method (index method + 1) that could not be requested
   * again for want of memory, and their sum; the cq thread alone uses
   * them, requesting each again after the next event. */
  int *owed, owed_total;
  int port;
  pthread_t cq_thread;
  pthread_t *workers;
  int nworkers;
  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* work queued or stopping */
  pthread_cond_t idle_cv; /* a live call finished */
  call_ctx *queue_head, *queue_tail;
  int live_calls; /* received and not yet done */
  int accepting;
  int stopping;
  int shutdown_notified;
  call_tag shutdown_tag;
  pthread_mutex_t auth_mu; /* guards auth: a reload swaps it under calls */
  distd_auth *auth;   /* NULL: no token checks */
  distd_tls_grpc *certs; /* NULL without TLS; outlives the server */
  client_load *loads; /* guarded by mu */
};

static void arm(distd_rpc *r, int method);

static call_ctx *ctx_new(distd_rpc *r, int method) {
  call_ctx *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->rpc = r;
  c->method = method;
  grpc_metadata_array_init(&c->md);
  grpc_call_details_init(&c->details);
  c->t_new = (call_tag){c, TAG_NEW};
  c->t_done = (call_tag){c, TAG_DONE};
  return c;
}

static void ctx_free(call_ctx *c) {
  if (c->request) grpc_byte_buffer_destroy(c->request);
  if (c->reply) grpc_byte_buffer_destroy(c->reply);
  grpc_metadata_array_destroy(&c->md);
  grpc_call_details_destroy(&c->details);
  if (c->call) grpc_call_unref(c->call);
  free(c);
}

/* Asks gRPC for the next call of method. Without memory for it the call
 * is owed, and asked for again after the next event (rearm_owed): a
 * method whose calls all went unrequested would never be answered. */
static void arm(distd_rpc *r, int method) {
  call_ctx *c = ctx_new(r, method);
  if (!c) {
    r->owed[method + 1]++;
    r->owed_total++;
    return;
  }
  grpc_call_error e;
  if (method >= 0)
    e = grpc_server_request_registered_call(
        r->server, r->handles[method], &c->call, &c->deadline, &c->md,
        &c->request, r->cq, r->cq, &c->t_new);
  else
    e = grpc_server_request_call(r->server, &c->call, &c->details, &c->md,
                                 r->cq, r->cq, &c->t_new);
  if (e != GRPC_CALL_OK) {
    log_error("rpc: cannot request calls: %s", grpc_call_error_to_string(e));
    ctx_free(c);
  }
}

/* Sends the reply (if any) and the status in one batch; TAG_DONE frees c. */
static void finish(call_ctx *c, grpc_status_code code, const char *details) {
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  if (c->reply && code == GRPC_STATUS_OK) {
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = c->reply;
  }
  ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
  snprintf(c->status_details, sizeof c->status_details, "%s",
           details ? details : "");
  c->details_slice = grpc_slice_from_static_string(c->status_details);
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = code;
  ops[n++].data.send_status_from_server.status_details =
      details ? &c->details_slice : NULL;
  /* Record before starting the batch: its completion frees c. */
  if (c->method >= 0 && c->rpc->srv->metrics)
    distd_metrics_rpc(c->rpc->srv->metrics, c->rpc->methods[c->method].name,
                      code, distd_now_s() - c->started);
  grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->t_done, NULL);
  if (e != GRPC_CALL_OK) {
    log_error("rpc: cannot send reply: %s", grpc_call_error_to_string(e));
  }
}

/* Converts the call deadline to CLOCK_MONOTONIC milliseconds, bounded by
 * max_call_duration: no call runs forever, whatever its client asked.
 * The daemon gives up a little before its client does (a twentieth of the
 * time left, 5 to 250 ms), so that its reply saying what it waited for (a
 * rank that never joined a vote or an exchange) reaches the client
 * instead of the client's own bare "no answer". */
static int64_t deadline_ms(gpr_timespec deadline, int64_t max_ms) {
  int64_t now = distd_now_ms(), bound = now + max_ms;
  gpr_timespec rt = gpr_convert_clock_type(deadline, GPR_CLOCK_REALTIME);
  if (gpr_time_cmp(rt, gpr_inf_future(GPR_CLOCK_REALTIME)) == 0) return bound;
  int64_t left = gpr_time_to_millis(gpr_time_sub(rt, gpr_now(GPR_CLOCK_REALTIME)));
  int64_t margin = left / 20 < 5 ? 5 : left / 20 > 250 ? 250 : left / 20;
  int64_t d = now + left - margin;
  return d < bound ? d : bound;
}

/* ---- admission: tokens, in-flight limit, tensor bytes ---- */

/* The "authorization" header's bearer token, or 0. */
static size_t call_token(const call_ctx *c, const char **token) {
  for (size_t i = 0; i < c->md.count; i++) {
    const grpc_metadata *md = &c->md.metadata[i];
    if (grpc_slice_str_cmp(md->key, "authorization") != 0) continue;
    return distd_auth_bearer((const char *)GRPC_SLICE_START_PTR(md->value),
                             GRPC_SLICE_LENGTH(md->value), token);
  }
  return 0;
}

/* The client's host as gRPC reports the peer ("ipv4:10.0.0.5:41234"),
 * without the port: one host with many connections is one client. */
static void peer_host_key(const call_ctx *c, char *key, size_t len) {
  char *peer = grpc_call_get_peer(c->call);
  char *colon = peer ? strrchr(peer, ':') : NULL;
  if (colon && colon != strchr(peer, ':')) *colon = 0;
  snprintf(key, len, "host:%s", peer ? peer : "?");
  gpr_free(peer);
}

static int reject(call_ctx *c, const char *reason, int code, dist_errbuf *eb,
                  const char *fmt, const char *method) {
  if (c->rpc->srv->metrics) distd_metrics_auth_rejected(c->rpc->srv->metrics, reason);
  log_debug("rpc %s: refused (%s)", method, reason);
  return dist_fail(eb, code, fmt, method);
}

/* The role of token (len bytes; 0: none given) in the tokens in use, or
 * -1 when the daemon checks no tokens. */
static int current_role(distd_rpc *r, const char *token, size_t len) {
  pthread_mutex_lock(&r->auth_mu);
  int role = !r->auth ? -1 : len ? (int)distd_auth_lookup(r->auth, token, len)
                                 : (int)DISTD_ROLE_NONE;
  pthread_mutex_unlock(&r->auth_mu);
  return role;
}

int distd_rpc_reload_tokens(distd_rpc *r, dist_errbuf *eb) {
  const char *path = r->srv->cfg.auth_tokens_file;
  if (!path[0])
    return dist_fail(eb, DIST_EINVAL, "no auth_tokens_file is configured: there are no "
                     "tokens to reload");
  distd_auth *fresh = NULL;
  if (distd_auth_load(path, &fresh, eb) != 0) {
    dist_errbuf_prefix(eb, "the tokens in use stay: ");
    return eb->code;
  }
  pthread_mutex_lock(&r->auth_mu);
  distd_auth *old = r->auth;
  r->auth = fresh;
  pthread_mutex_unlock(&r->auth_mu);
  distd_auth_free(old);
  log_info("reloaded %d bearer tokens from %s", distd_auth_count(fresh), path);
  return 0;
}

int distd_rpc_reload_certs(distd_rpc *r, const distd_tls_files *tls, dist_errbuf *eb) {
  if (!r->certs) return 0;
  return distd_tls_grpc_reload(r->certs, tls, eb);
}

/* Checks the caller's token against the method's access; sets key to the
 * identity the in-flight limit counts. */
static int authorize(call_ctx *c, const distd_method *m, char *key, size_t len,
                     dist_errbuf *eb) {
  const char *token = NULL;
  size_t tlen = call_token(c, &token);
  if (tlen) snprintf(key, len, "token:%016llx", (unsigned long long)dist_fnv1a(token, tlen));
  else peer_host_key(c, key, len);
  if (c->rpc->certs && distd_tls_grpc_check_call(c->rpc->certs, c->call, eb) != 0) {
    if (c->rpc->srv->metrics) distd_metrics_auth_rejected(c->rpc->srv->metrics, "revoked_certificate");
    dist_errbuf_prefix(eb, "%s: ", m->name);
    return eb->code;
  }
  if (m->access == DISTD_ACCESS_OPEN) return 0;
  int role = current_role(c->rpc, token, tlen);
  if (role < 0) return 0; /* no tokens file: no checks */
  if (!tlen)
    return reject(c, "missing_token", DIST_EAUTH, eb,
                  "%s needs a bearer token: send \"authorization: Bearer TOKEN\" "
                  "(distctl --token-file, DIST_TOKEN)", m->name);
  if (role == DISTD_ROLE_NONE)
    return reject(c, "unknown_token", DIST_EAUTH, eb,
                  "%s: the bearer token is not one this daemon knows", m->name);
  if (role == DISTD_ROLE_READ_ONLY && m->access == DISTD_ACCESS_WRITE)
    return reject(c, "read_only_token", DIST_EPERM, eb,
                  "%s changes state and needs a read-write token; this token "
                  "is read-only", m->name);
  return 0;
}

static client_load *load_find(distd_rpc *r, const char *key) {
  for (client_load *l = r->loads; l; l = l->next)
    if (strcmp(l->key, key) == 0) return l;
  client_load *l = calloc(1, sizeof *l);
  if (!l) return NULL;
  snprintf(l->key, sizeof l->key, "%s", key);
  l->next = r->loads;
  r->loads = l;
  return l;
}

/* Counts the call against its client; fails past max_inflight_per_client. */
static int load_acquire(distd_rpc *r, const distd_method *m, const char *key,
                        client_load **out, dist_errbuf *eb) {
  int64_t limit = r->srv->cfg.max_inflight_per_client;
  *out = NULL;
  if (limit <= 0 || m->access == DISTD_ACCESS_OPEN) return 0;
  int rc = 0;
  pthread_mutex_lock(&r->mu);
  client_load *l = load_find(r, key);
  if (!l)
    rc = dist_fail(eb, DIST_ENOMEM, "out of memory counting calls");
  else if (l->inflight >= limit)
    rc = dist_fail(eb, DIST_ETOOBIG, "%s refused: this client already has %d "
                   "calls in progress, the most max_inflight_per_client (%lld) "
                   "allows", m->name, l->inflight, (long long)limit);
  else
    l->inflight++, *out = l;
  pthread_mutex_unlock(&r->mu);
  return rc;
}

static void load_release(distd_rpc *r, client_load *l) {
  if (!l) return;
  pthread_mutex_lock(&r->mu);
  if (--l->inflight == 0) { /* forget idle clients: the list stays short */
    for (client_load **pp = &r->loads; *pp; pp = &(*pp)->next)
      if (*pp == l) {
        *pp = l->next;
        free(l);
        break;
      }
  }
  pthread_mutex_unlock(&r->mu);
}

/* Bytes carried in bytes fields of m and its sub-messages: the tensor data
 * a request brings, whatever the method. */
static uint64_t payload_bytes(const ProtobufCMessage *m, int depth) {
  uint64_t total = 0;
  if (!m || depth > BYTES_WALK_DEPTH) return 0;
  const ProtobufCMessageDescriptor *d = m->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    const char *at = (const char *)m + f->offset;
    size_t n = 1;
    if (f->type != PROTOBUF_C_TYPE_BYTES && f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      n = *(const size_t *)((const char *)m + f->quantifier_offset);
      at = *(const char *const *)at;
    }
    for (size_t k = 0; k < n && at; k++) {
      if (f->type == PROTOBUF_C_TYPE_BYTES)
        total += ((const ProtobufCBinaryData *)at)[k].len;
      else
        total += payload_bytes(((const ProtobufCMessage *const *)at)[k], depth + 1);
    }
  }
  return total;
}

static int check_tensor_bytes(distd_rpc *r, const distd_method *m,
                              const ProtobufCMessage *req, dist_errbuf *eb) {
  uint64_t limit = r->srv->cfg.max_tensor_bytes;
  if (limit == 0) return 0;
  uint64_t n = payload_bytes(req, 0);
  if (n <= limit) return 0;
  return dist_fail(eb, DIST_ETOOBIG, "%s carries %llu tensor bytes, more than "
                   "max_tensor_bytes (%llu) allows: send it in pieces",
                   m->name, (unsigned long long)n, (unsigned long long)limit);
}

/* A request this daemon could not unpack for want of memory: its part
 * will not run, and the op's other daemons would wait for it until their
 * deadline. Its op id, read off the raw request, is refused on every
 * daemon (the op's group is in the part not read), with the ids after it
 * that a LocalLayer call's outputs take, one per out_names entry, as a
 * refused call's are (svc_program.c). A LocalLayer backward's op is its
 * invocation's id (its vote is one of that id's steps). */
static void refuse_unread(call_ctx *c, const distd_method *m, const dist_errbuf *eb) {
  const ProtobufCFieldDescriptor *f =
      protobuf_c_message_descriptor_get_field_by_name(m->request, "op_id");
  if (!f) f = protobuf_c_message_descriptor_get_field_by_name(m->request, "invocation_id");
  const ProtobufCFieldDescriptor *outs =
      protobuf_c_message_descriptor_get_field_by_name(m->request, "out_names");
  uint64_t op_id = 0, unused;
  if (!f || f->type != PROTOBUF_C_TYPE_UINT64 || f->label == PROTOBUF_C_LABEL_REPEATED ||
      !dist_bb_scan_field(c->request, f->id, &op_id) || op_id == 0)
    return;
  size_t more = outs ? dist_bb_scan_field(c->request, outs->id, &unused) : 0;
  distd_server *s = c->rpc->srv;
  int world[DIST_MAX_MESH_RANKS], n = s->world_size < DIST_MAX_MESH_RANKS ? s->world_size
                                                                          : DIST_MAX_MESH_RANKS;
  for (int r = 0; r < n; r++) world[r] = r;
  distd_refuse_op(s, op_id, (uint32_t)(more < DIST_MAX_MESH_RANKS ? more : DIST_MAX_MESH_RANKS),
                  world, n, "its daemon", dist_errbuf_msg(eb));
}

static void run_handler(call_ctx *c, const distd_method *m,
                        const distd_call_info *ci, dist_errbuf *eb) {
  int no_memory = 0;
  ProtobufCMessage *req = dist_bb_to_pb(c->request, m->request, &no_memory);
  if (!req && no_memory) {
    dist_fail(eb, DIST_ENOMEM, "%s: out of memory for the request", m->name);
    refuse_unread(c, m, eb);
    return;
  }
  if (!req) {
    dist_fail(eb, DIST_EINVAL, "malformed %s request: not a valid %s message",
              m->name, m->request->name);
    return;
  }
  if (check_tensor_bytes(c->rpc, m, req, eb) == 0) {
    __atomic_add_fetch(&c->rpc->srv->ops_in_flight, 1, __ATOMIC_SEQ_CST);
    int rc = m->handler(c->rpc->srv, ci, req, &c->reply, eb);
    __atomic_sub_fetch(&c->rpc->srv->ops_in_flight, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&c->rpc->srv->calls_done, 1, __ATOMIC_RELAXED);
    if (rc != 0 && eb->code == 0) eb->code = rc;
  }
  protobuf_c_message_free_unpacked(req, NULL);
}

/* Ends a call no handler will run, saying why in the log (the client
 * rarely sees the status: it has usually given up already). */
static void not_run(call_ctx *c, grpc_status_code code, const char *why) {
  log_info("rpc %s not run: %s (%.0f ms after the daemon read it)",
           c->rpc->methods[c->method].name, why, (distd_now_s() - c->started) * 1e3);
  finish(c, code, why);
}

/* A call that arrived without its request was cancelled before the daemon
 * read it: its client gave up while the daemon was frozen, stalled or
 * swamped, and sent the cancellation after the call. gRPC still hands such
 * a call over, with no request, and with a deadline counted from when the
 * daemon read it, so it looks alive. (A unary client always sends a
 * request; grpc_call_failed_before_recv_message does not tell these calls
 * apart in gRPC 1.51.) 1 when the call was ended here. */
static int cancelled_before_request(call_ctx *c) {
  if (c->request) return 0;
  not_run(c, GRPC_STATUS_CANCELLED, "ECANCELED: no request arrived: its client "
                                    "cancelled the call before the daemon read it");
  return 1;
}

static void handle(call_ctx *c) {
  distd_rpc *r = c->rpc;
  const distd_method *m = &r->methods[c->method];
  distd_call_info ci = {deadline_ms(c->deadline, r->srv->cfg.max_call_duration_ms),
                        m->name};
  dist_errbuf eb = DIST_ERRBUF_INIT;
  char details[600], key[96];
  client_load *load = NULL;
  if (cancelled_before_request(c)) return;
  if (ci.deadline_ms <= distd_now_ms()) {
    not_run(c, GRPC_STATUS_DEADLINE_EXCEEDED,
            "ETIMEDOUT: deadline passed before the call was handled");
    return;
  }
  if (authorize(c, m, key, sizeof key, &eb) == 0 &&
      load_acquire(r, m, key, &load, &eb) == 0)
    run_handler(c, m, &ci, &eb);
  load_release(r, load);
  if (eb.code == 0) {
    finish(c, GRPC_STATUS_OK, NULL);
    return;
  }
  log_debug("rpc %s failed: %s", m->name, dist_errbuf_msg(&eb));
  dist_status_details(&eb, details, sizeof details);
  finish(c, dist_err_to_grpc(eb.code), details);
}

static void answer_unimplemented(call_ctx *c) {
  char *method = grpc_slice_to_c_string(c->details.method);
  char details[600];
  snprintf(details, sizeof details, "ENOTSUP: unknown method %s", method);
  log_debug("rpc: %s", details);
  gpr_free(method);
  finish(c, GRPC_STATUS_UNIMPLEMENTED, details);
}

static void *worker_main(void *arg) {
  distd_rpc *r = arg;
  pthread_setname_np(pthread_self(), "distd-worker");
  for (;;) {
    pthread_mutex_lock(&r->mu);
    while (!r->queue_head && !r->stopping) pthread_cond_wait(&r->work_cv, &r->mu);
    call_ctx *c = r->queue_head;
    if (c) {
      r->queue_head = c->next;
      if (!r->queue_head) r->queue_tail = NULL;
    }
    pthread_mutex_unlock(&r->mu);
    if (!c) return NULL; /* stopping and drained */
    handle(c);
  }
}

static void enqueue(distd_rpc *r, call_ctx *c) {
  pthread_mutex_lock(&r->mu);
  c->next = NULL;
  if (r->queue_tail)
    r->queue_tail->next = c;
  else
    r->queue_head = c;
  r->queue_tail = c;
  pthread_cond_signal(&r->work_cv);
  pthread_mutex_unlock(&r->mu);
}

static void on_new_call(distd_rpc *r, call_ctx *c, int ok) {
  if (!ok) { /* the server is shutting down: this request was never matched */
    ctx_free(c);
    return;
  }
  pthread_mutex_lock(&r->mu);
  r->live_calls++;
  int rearm = r->accepting;
  pthread_mutex_unlock(&r->mu);
  if (rearm) arm(r, c->method);
  c->started = distd_now_s();
  if (c->method < 0)
    answer_unimplemented(c);
  else
    enqueue(r, c);
}

static void on_call_done(distd_rpc *r, call_ctx *c) {
  ctx_free(c);
  pthread_mutex_lock(&r->mu);
  r->live_calls--;
  pthread_cond_broadcast(&r->idle_cv);
  pthread_mutex_unlock(&r->mu);
}

static void rearm_owed(distd_rpc *r) {
  if (r->owed_total == 0) return;
  pthread_mutex_lock(&r->mu);
  int accepting = r->accepting;
  pthread_mutex_unlock(&r->mu);
  if (!accepting) return;
  for (int i = 0; i <= r->nmethods; i++)
    for (int owed = r->owed[i]; owed > 0; owed--) {
      r->owed[i]--;
      r->owed_total--;
      arm(r, i - 1); /* owes it again if it fails again */
    }
}

static void *cq_main(void *arg) {
  distd_rpc *r = arg;
  pthread_setname_np(pthread_self(), "distd-cq");
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(
        r->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) return NULL;
    if (ev.type != GRPC_OP_COMPLETE) continue;
    call_tag *t = ev.tag;
    if (t == &r->shutdown_tag) {
      pthread_mutex_lock(&r->mu);
      r->shutdown_notified = 1;
      pthread_cond_broadcast(&r->idle_cv);
      pthread_mutex_unlock(&r->mu);
    } else if (t->kind == TAG_NEW) {
      on_new_call(r, t->ctx, ev.success);
    } else {
      on_call_done(r, t->ctx);
    }
    rearm_owed(r);
  }
}

static grpc_server *create_server(const distd_config *cfg) {
  /* max_message_size bounds what gRPC accepts; max_tensor_bytes is checked
   * per request after unpacking. */
  grpc_arg args[3];
  args[0].type = GRPC_ARG_INTEGER;
  args[0].key = (char *)GRPC_ARG_ALLOW_REUSEPORT;
  args[0].value.integer = 0;
  int max = cfg->max_message_size > INT32_MAX ? INT32_MAX
                                              : (int)cfg->max_message_size;
  args[1].type = GRPC_ARG_INTEGER;
  args[1].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[1].value.integer = max;
  args[2].type = GRPC_ARG_INTEGER;
  args[2].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  args[2].value.integer = max;
  grpc_channel_args ca = {3, args};
  return grpc_server_create(&ca, NULL);
}

static int bind_port(distd_rpc *r, const char *addr, const distd_tls_files *tls,
                     dist_errbuf *eb) {
  const distd_config *cfg = &r->srv->cfg;
  grpc_server_credentials *creds = NULL;
  if (distd_tls_grpc_server_creds(cfg, tls, &r->certs, &creds, eb) != 0) return eb->code;
  distd_tls_warn_plain("the gRPC port", addr, tls->cert != NULL);
  r->port = grpc_server_add_http2_port(r->server, addr, creds);
  grpc_server_credentials_release(creds);
  if (r->port <= 0)
    return dist_fail(eb, DIST_EUNAVAIL,
                     "cannot listen on %s for gRPC: the address is in use "
                     "or not local (is another distd running there?)",
                     addr);
  return 0;
}

static void free_rpc(distd_rpc *r) {
  free(r->workers);
  free(r->handles);
  free(r->owed);
  free(r);
}

/* The server's tables, all allocated before anything starts, so that a
 * start that cannot have them fails with nothing to undo. */
static distd_rpc *new_rpc(distd_server *s, const distd_method *methods, int n) {
  distd_rpc *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->srv = s;
  r->methods = methods;
  r->nmethods = n;
  r->nworkers = (int)s->cfg.rpc_threads;
  r->handles = calloc((size_t)n, sizeof *r->handles);
  r->owed = calloc((size_t)n + 1, sizeof *r->owed);
  r->workers = calloc((size_t)r->nworkers + 1, sizeof *r->workers);
  if (r->handles && r->owed && r->workers) return r;
  free_rpc(r);
  return NULL;
}

int distd_rpc_start(distd_server *s, const distd_method *methods, int n,
                    const distd_tls_files *tls, dist_errbuf *eb) {
  distd_auth *auth = NULL;
  if (s->cfg.auth_tokens_file[0]) {
    if (distd_auth_load(s->cfg.auth_tokens_file, &auth, eb) != 0) return eb->code;
    log_info("gRPC clients need bearer tokens: %d loaded from %s",
             distd_auth_count(auth), s->cfg.auth_tokens_file);
  } else if (!distd_addr_is_loopback(s->cfg.listen)) {
    log_warn("no auth_tokens_file: every client that reaches %s may call "
             "every method", s->cfg.listen);
  }
  distd_rpc *r = new_rpc(s, methods, n);
  if (!r) {
    distd_auth_free(auth);
    return dist_fail(eb, DIST_ENOMEM, "out of memory for the gRPC server's tables");
  }
  r->auth = auth;
  pthread_mutex_init(&r->auth_mu, NULL);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->work_cv, NULL);
  pthread_cond_init(&r->idle_cv, NULL);
  r->server = create_server(&s->cfg);
  r->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(r->server, r->cq, NULL);
  for (int i = 0; i < n; i++)
    r->handles[i] = grpc_server_register_method(
        r->server, methods[i].path, NULL,
        GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
  int rc = bind_port(r, s->cfg.listen, tls, eb);
  if (rc != 0) {
    grpc_server_destroy(r->server);
    grpc_completion_queue_shutdown(r->cq);
    while (grpc_completion_queue_next(r->cq, gpr_inf_future(GPR_CLOCK_REALTIME),
                                      NULL).type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(r->cq);
    distd_tls_grpc_free(r->certs);
    distd_auth_free(r->auth);
    pthread_mutex_destroy(&r->auth_mu);
    free_rpc(r);
    return rc;
  }
  grpc_server_start(r->server);
  r->accepting = 1;
  s->rpc = r;
  for (int i = 0; i < n; i++)
    for (int k = 0; k < PREARMED_PER_METHOD; k++) arm(r, i);
  arm(r, -1);
  pthread_create(&r->cq_thread, NULL, cq_main, r);
  int want = r->nworkers;
  r->nworkers = 0; /* those started, which distd_rpc_free joins */
  while (r->nworkers < want &&
         pthread_create(&r->workers[r->nworkers], NULL, worker_main, r) == 0)
    r->nworkers++;
  if (r->nworkers < want)
    return dist_fail(eb, DIST_ENOMEM, "cannot start the gRPC worker threads: %d of %d started",
                     r->nworkers, want);
  return 0;
}

int distd_rpc_port(const distd_rpc *r) { return r->port; }

/* Waits on idle_cv until pred holds or the monotonic deadline passes. */
static void wait_until(distd_rpc *r, int (*pred)(distd_rpc *), int64_t until) {
  pthread_mutex_lock(&r->mu);
  while (!pred(r) && distd_now_ms() < until) {
    pthread_mutex_unlock(&r->mu);
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL); /* idle_cv uses CLOCK_REALTIME: poll instead */
    pthread_mutex_lock(&r->mu);
  }
  pthread_mutex_unlock(&r->mu);
}

static int no_live_calls(distd_rpc *r) { return r->live_calls == 0; }
static int shutdown_seen(distd_rpc *r) { return r->shutdown_notified; }

void distd_rpc_shutdown(distd_rpc *r, int64_t grace_ms) {
  if (!r) return;
  pthread_mutex_lock(&r->mu);
  r->accepting = 0;
  pthread_mutex_unlock(&r->mu);
  grpc_server_shutdown_and_notify(r->server, r->cq, &r->shutdown_tag);
  wait_until(r, no_live_calls, distd_now_ms() + grace_ms);
  /* Whatever is still running now fails with UNAVAILABLE/CANCELLED. */
  grpc_server_cancel_all_calls(r->server);
}

void distd_rpc_free(distd_rpc *r) {
  if (!r) return;
  pthread_mutex_lock(&r->mu);
  r->stopping = 1;
  pthread_cond_broadcast(&r->work_cv);
  pthread_mutex_unlock(&r->mu);
  for (int i = 0; i < r->nworkers; i++) pthread_join(r->workers[i], NULL);
  wait_until(r, no_live_calls, distd_now_ms() + 10000);
  wait_until(r, shutdown_seen, distd_now_ms() + 10000);
  grpc_server_destroy(r->server);
  grpc_completion_queue_shutdown(r->cq);
  pthread_join(r->cq_thread, NULL);
  grpc_completion_queue_destroy(r->cq);
  distd_tls_grpc_free(r->certs); /* no handshake asks for them any more */
  pthread_cond_destroy(&r->work_cv);
  pthread_cond_destroy(&r->idle_cv);
  pthread_mutex_destroy(&r->mu);
  while (r->loads) {
    client_load *l = r->loads;
    r->loads = l->next;
    free(l);
  }
  distd_auth_free(r->auth);
  pthread_mutex_destroy(&r->auth_mu);
  free_rpc(r);
}
