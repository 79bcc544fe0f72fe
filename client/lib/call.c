/* Unary calls to many daemons at once on one completion queue. */
#include <grpc/byte_buffer_reader.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "daemon_crl.h"
#include "pbuf.h"
#include "reconnect.h"
#include "status.h"

typedef struct call_state {
  grpc_call *call;
  grpc_byte_buffer *send, *recv;
  grpc_metadata_array initial_md, trailing_md;
  grpc_status_code status;
  grpc_slice details;
} call_state;

/* The one place a call's target, the rank of the daemon it addresses,
 * becomes a channel: position r for a client of a cluster file; the one
 * channel of a client of one endpoint, whatever rank its daemon has
 * (reach.c checks a rank can be reached where it enters libdist). */
static int channel_of(const dist_client *c, int target) {
  return c->one_endpoint ? 0 : target;
}

/* The endpoint of the daemon a call addresses. */
static const char *endpoint_of(const dist_client *c, int target) {
  return c->endpoints[channel_of(c, target)];
}

/* What start took for a call, given back: after its completion, or at
 * once when its batch did not start (no completion will come). */
static void release_state(call_state *st) {
  if (st->send) grpc_byte_buffer_destroy(st->send);
  if (st->recv) grpc_byte_buffer_destroy(st->recv);
  grpc_metadata_array_destroy(&st->initial_md);
  grpc_metadata_array_destroy(&st->trailing_md);
  if (st->call) grpc_call_unref(st->call);
}

static int start(dist_client *c, grpc_completion_queue *cq, const char *method,
                 dist_call *dc, call_state *st, gpr_timespec deadline) {
  grpc_slice m = grpc_slice_from_static_string(method);
  st->call = grpc_channel_create_call(c->channels[channel_of(c, dc->target)], NULL,
                                      GRPC_PROPAGATE_DEFAULTS, cq, m, NULL,
                                      deadline, NULL);
  st->send = dist_pb_to_bb(dc->request);
  grpc_metadata_array_init(&st->initial_md);
  grpc_metadata_array_init(&st->trailing_md);
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count = c->auth_md_count;
  ops[0].data.send_initial_metadata.metadata = c->auth_md_count ? &c->auth_md : NULL;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = st->send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &st->initial_md;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &st->recv;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &st->trailing_md;
  ops[5].data.recv_status_on_client.status = &st->status;
  ops[5].data.recv_status_on_client.status_details = &st->details;
  return grpc_call_start_batch(st->call, ops, 6, st, NULL) == GRPC_CALL_OK ? 0 : -1;
}

/* Whether status details are a daemon's own explanation ("EUNAVAIL: 'w'
 * is being resharded ..."), which starts with the code's name, rather
 * than gRPC's word for a channel or a deadline. */
static int from_daemon(const char *details, int code) {
  const char *name = dist_err_name(code);
  return strncmp(details, name, strlen(name)) == 0;
}

/* A daemon gRPC could not reach; when tls_crl refused its certificate,
 * the reason (gRPC's details only say the handshake failed). */
static void unreachable(dist_client *c, dist_call *dc, const char *details) {
  const char *at = endpoint_of(c, dc->target);
  char why[400];
  if (c->daemon_crl &&
      dist_daemon_crl_refusal(c->daemon_crl, channel_of(c, dc->target), why, sizeof why))
    dist_fail(&dc->err, DIST_EAUTH, "distd at %s is refused: %s", at, why);
  else
    dist_fail(&dc->err, DIST_EUNAVAIL, "cannot reach distd at %s: %s", at, details);
}

static void finish(dist_client *c, dist_call *dc, call_state *st,
                   const ProtobufCMessageDescriptor *reply_desc) {
  char *details = grpc_slice_to_c_string(st->details);
  int answered = 1; /* a reply, or the daemon's own error */
  if (st->status != GRPC_STATUS_OK) {
    dist_status_parse(st->status, details, &dc->err);
    if (st->status == GRPC_STATUS_UNAVAILABLE && dc->err.code == DIST_EUNAVAIL &&
        !from_daemon(details, DIST_EUNAVAIL)) {
      unreachable(c, dc, details);
      answered = 0;
    } else if (st->status == GRPC_STATUS_DEADLINE_EXCEEDED && dc->err.code == DIST_ETIMEDOUT &&
               !from_daemon(details, DIST_ETIMEDOUT)) {
      dist_fail(&dc->err, DIST_ETIMEDOUT,
                "no answer from distd at %s within %lld ms", endpoint_of(c, dc->target),
                (long long)c->timeout_ms);
      answered = 0;
    }
  } else {
    int no_memory = 0;
    dc->applied = 1;
    dc->reply = dist_bb_to_pb(st->recv, reply_desc, &no_memory);
    if (!dc->reply && no_memory)
      dist_fail(&dc->err, DIST_ENOMEM, "out of memory for the reply from %s",
                endpoint_of(c, dc->target));
    else if (!dc->reply)
      dist_fail(&dc->err, DIST_EPROTO, "malformed reply from %s", endpoint_of(c, dc->target));
  }
  dc->unanswered = !answered;
  dist_client_note_answer(c, dc->target, answered);
  gpr_free(details);
  grpc_slice_unref(st->details);
  release_state(st);
}

/* The failed call whose error to report, or -1: the first, unless another
 * failed for a reason of its own while it was cancelled, by the abort a
 * failing daemon sends its peers (ECANCELED, "rank 1 aborted ..."). */
static int cause(const dist_call *calls, int n) {
  int first = -1;
  for (int i = 0; i < n; i++) {
    if (calls[i].err.code == 0) continue;
    if (calls[i].err.code != DIST_ECANCELED) return i;
    if (first < 0) first = i;
  }
  return first;
}

const char *dist_daemon_label(const dist_client *c, int target, char *buf, size_t len) {
  if (c->one_endpoint)
    snprintf(buf, len, "distd at %s", endpoint_of(c, target));
  else
    snprintf(buf, len, "rank %d (%s)", target, c->endpoints[target]);
  return buf;
}

int dist_call_fail(dist_client *c, const dist_call *call) {
  const char *msg = dist_errbuf_msg(&call->err), *at = endpoint_of(c, call->target);
  char named[300];
  dist_daemon_label(c, call->target, named, sizeof named);
  /* "cannot reach distd at HOST:PORT" names the address, not the rank:
   * enough for a client of one endpoint, which knows no rank. */
  if (strstr(msg, named) || (c->one_endpoint && strstr(msg, at)))
    return dist_client_fail(c, call->err.code, "%s", msg);
  if (strstr(msg, at))
    return dist_client_fail(c, call->err.code, "rank %d: %s", call->target, msg);
  return dist_client_fail(c, call->err.code, "%s: %s", named, msg);
}

/* The channels of the calls connected again where they failed before
 * (reconnect.h), all at once; without memory for their list, the calls
 * go as they are. */
static void reconnect_channels(dist_client *c, const dist_call *calls, int n,
                               gpr_timespec deadline) {
  grpc_channel *one, **chs = n == 1 ? &one : malloc((size_t)n * sizeof *chs);
  if (!chs) return;
  for (int i = 0; i < n; i++) chs[i] = c->channels[channel_of(c, calls[i].target)];
  dist_reconnect_failed(chs, n, deadline);
  if (chs != &one) free(chs);
}

/* The calls, each within timeout_ms; each call's error in its own err,
 * c->err untouched. */
static void call_batch(dist_client *c, const char *method,
                       const ProtobufCMessageDescriptor *reply_desc, dist_call *calls, int n,
                       int64_t timeout_ms) {
  /* One call's state lives here: a single call (an undo's delete among
   * them) needs no allocation before it is sent. */
  call_state one;
  memset(&one, 0, sizeof one);
  call_state *st = n == 1 ? &one : calloc((size_t)n + 1, sizeof *st);
  if (!st) {
    for (int i = 0; i < n; i++) {
      calls[i].reply = NULL, calls[i].applied = 0, calls[i].unanswered = 0;
      dist_fail(&calls[i].err, DIST_ENOMEM, "out of memory starting %d call(s) of %s", n,
                method);
    }
    return;
  }
  grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
  gpr_timespec deadline = gpr_time_add(
      gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
  reconnect_channels(c, calls, n, deadline);
  int started = 0;
  for (int i = 0; i < n; i++) {
    calls[i].reply = NULL;
    calls[i].applied = 0;
    calls[i].unanswered = 0;
    calls[i].err = (dist_errbuf)DIST_ERRBUF_INIT;
    if (start(c, cq, method, &calls[i], &st[i], deadline) == 0) {
      started++;
      continue;
    }
    release_state(&st[i]);
    dist_fail(&calls[i].err, DIST_EINTERNAL, "cannot start call %s to %s", method,
              endpoint_of(c, calls[i].target));
  }
  /* The call deadline bounds every completion; core always completes. */
  for (int done = 0; done < started; done++) {
    grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    call_state *s = ev.tag;
    finish(c, &calls[s - st], s, reply_desc);
  }
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
  if (st != &one) free(st);
}

int dist_call_many(dist_client *c, const char *method,
                   const ProtobufCMessageDescriptor *reply_desc,
                   dist_call *calls, int n) {
  c->err = (dist_errbuf)DIST_ERRBUF_INIT; /* errors describe the last call */
  call_batch(c, method, reply_desc, calls, n, c->timeout_ms);
  int i = cause(calls, n);
  return i < 0 ? 0 : dist_call_fail(c, &calls[i]);
}

ProtobufCMessage *dist_call_aside(dist_client *c, int target, const char *method,
                                  const ProtobufCMessage *request,
                                  const ProtobufCMessageDescriptor *reply_desc,
                                  int64_t timeout_ms) {
  dist_call dc = {.target = target, .request = request};
  call_batch(c, method, reply_desc, &dc, 1, timeout_ms);
  return dc.reply;
}

void dist_calls_free(dist_call *calls, int n) {
  for (int i = 0; i < n; i++)
    if (calls[i].reply) protobuf_c_message_free_unpacked(calls[i].reply, NULL);
}

int dist_call_all(dist_client *c, const char *method, const ProtobufCMessageDescriptor *reply_desc,
                  const ProtobufCMessage *request, const int *targets, int n, dist_call **out) {
  *out = calloc((size_t)(n > 0 ? n : 0) + 1, sizeof **out);
  if (!*out) return dist_client_fail(c, DIST_ENOMEM, "out of memory calling %d daemons", n);
  for (int i = 0; i < n; i++) {
    (*out)[i].target = targets ? targets[i] : dist_rank_at(c, i);
    (*out)[i].request = request;
  }
  return dist_call_many(c, method, reply_desc, *out, n > 0 ? n : 0);
}

int dist_calls_any_applied(const dist_call *calls, int n) {
  for (int i = 0; calls && i < n; i++)
    if (calls[i].applied) return 1;
  return 0;
}

void dist_calls_release(dist_call *calls, int n) {
  if (!calls) return;
  dist_calls_free(calls, n > 0 ? n : 0);
  free(calls);
}

int dist_call_one_heard(dist_client *c, int target, const char *method,
                        const ProtobufCMessage *request,
                        const ProtobufCMessageDescriptor *reply_desc, int *unanswered) {
  dist_call dc = {.target = target, .request = request};
  int rc = dist_call_many(c, method, reply_desc, &dc, 1);
  dist_calls_free(&dc, 1);
  if (unanswered) *unanswered = dc.unanswered;
  return rc;
}

int dist_call_one(dist_client *c, int target, const char *method,
                  const ProtobufCMessage *request,
                  const ProtobufCMessageDescriptor *reply_desc,
                  ProtobufCMessage **reply) {
  dist_call dc = {.target = target, .request = request};
  int rc = dist_call_many(c, method, reply_desc, &dc, 1);
  *reply = dc.reply;
  return rc;
}
