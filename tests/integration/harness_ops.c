/* What a daemon's operations registry (dist_ops) says runs or ran there:
 * the condition a test waits for before it relies on a request being in
 * its vote, in place of a fixed sleep that a loaded host outlasts. */
#include <criterion/criterion.h>
#include <string.h>

#include "client_internal.h" /* dist_call_one: a raw OpAbort */
#include "harness.h"

uint64_t harness_last_finished(dist_client *c, int r, const char *kind) {
  dist_ops_report rep;
  cr_assert_eq(dist_ops(c, r, 0, &rep), 0, "ops of rank %d: %s", r, dist_errmsg(c));
  uint64_t found = 0;
  /* The finished ones follow those in flight, newest first. */
  for (int i = rep.n_in_flight; i < rep.n_in_flight + rep.n_recent && !found; i++)
    if (strcmp(rep.ops[i].kind, kind) == 0) found = rep.ops[i].op_id;
  dist_ops_report_free(&rep);
  return found;
}

/* 1 if daemon r runs an operation of kind whose op id is not not_op. */
static int running_now(dist_client *c, int r, const char *kind, uint64_t not_op) {
  dist_ops_report rep;
  if (dist_ops(c, r, 1, &rep) != 0) return 0; /* 0 would list every finished one */
  int found = 0;
  for (int i = 0; i < rep.n_in_flight; i++)
    found |= strcmp(rep.ops[i].kind, kind) == 0 && rep.ops[i].op_id != not_op;
  dist_ops_report_free(&rep);
  return found;
}

int harness_wait_running(dist_client *c, int r, const char *kind, uint64_t not_op,
                         int timeout_ms) {
  for (double until = harness_now_s() + timeout_ms / 1e3; harness_now_s() < until;
       harness_sleep_ms(20))
    if (running_now(c, r, kind, not_op)) return 1;
  return 0;
}

uint32_t harness_op_abort(harness *h, int via, uint64_t op_id, uint32_t more_ids,
                          uint32_t *ranks, size_t n, const char *reason) {
  Dist__V1__OpAbortRequest rq = DIST__V1__OP_ABORT_REQUEST__INIT;
  rq.op_id = op_id;
  rq.more_ids = more_ids;
  rq.n_ranks = n;
  rq.ranks = ranks;
  rq.reason = (char *)reason;
  dist_client *c = harness_client_rank(h, via, 10000);
  ProtobufCMessage *rp = NULL;
  cr_assert_eq(dist_call_one(c, via, "/dist.v1.Dist/OpAbort", &rq.base,
                             &dist__v1__op_abort_reply__descriptor, &rp), 0, "%s",
               dist_errmsg(c));
  uint32_t aborted = ((Dist__V1__OpAbortReply *)rp)->aborted_ids;
  protobuf_c_message_free_unpacked(rp, NULL);
  dist_close(c);
  return aborted;
}
