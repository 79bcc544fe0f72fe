/* Bodies of libdist's opaque types and the call machinery shared by its
 * files. Not installed. */
#ifndef DIST_CLIENT_INTERNAL_H
#define DIST_CLIENT_INTERNAL_H

#include <grpc/grpc.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <protobuf-c/protobuf-c.h>

#include "dist.pb-c.h"
#include "dist/dist.h"
#include "errbuf.h"
#include "mesh.h"
#include "tensor.h"

/* What a failed call may have left on daemons that did not answer it (no
 * reply within the deadline, or the connection lost; dist_call.unanswered),
 * or that answered it and then let its undo wait out the deadline
 * (dist_later_release_or_note): the names it stored, and the invocation a
 * LocalLayer call keeps for backward. Not undone at once, which would
 * cost a deadline per item while such a daemon is frozen, but later, by
 * the list's holder: a layer's next release, forward or destroy, a tape's
 * free, for calls of libdist's own with names of its own; the client's
 * next LocalLayer call or invocation release, or its close, for the
 * public LocalLayer call and backward (dist_client.later). Names with
 * tape ids (which carry the process's random token, process_token.h) or
 * op ids, and invocation ids, are never used again, so what is undone
 * later can only be the failed call's. A layer's step names
 * ("<layer>.s<step>...") are not: steps count per layer object, and a new
 * layer of the same name makes the same names; nor is a parameter's
 * gradient ("<param>.grad"), named alike each step. So a step that makes
 * or files such a name forgets its notes (dist_later_forget) before a
 * later undo could delete it. */
typedef struct dist_later_item {
  char name[256];      /* a tensor to delete, or "": */
  uint64_t invocation; /* the invocation to release */
  int rank;
  int unanswered;      /* its daemon did not answer in the last undo */
} dist_later_item;
typedef struct dist_later {
  dist_later_item *items;
  int n;
} dist_later;

struct dist_client {
  int n;                     /* daemons */
  char (*endpoints)[256];
  grpc_channel **channels;
  int spmd_rank;             /* -1: single client */
  /* Made by dist_connect for one endpoint: errors of its calls name the
   * daemon by its address (dist_daemon_label), and its rank, which is
   * not its position 0, is learned from its Info reply when first needed
   * (dist_daemon_rank). -1 until then; atomic, though a client is for one
   * thread at a time (dist.h), as its error, op ids and later list are. */
  int one_endpoint;
  _Atomic int daemon_rank;
  /* When (monotonic ms) a call to that daemon last went unanswered, 0
   * once one is answered (dist_client_note_answer): right after, its
   * rank is not asked aside. */
  _Atomic int64_t unanswered_ms;
  int64_t timeout_ms;
  uint64_t op_base;          /* op ids are op_base + sequence */
  uint64_t op_seq;
  dist_errbuf err;
  /* "authorization: Bearer TOKEN" sent with every call; count 0 without a
   * token. The slices live as long as the client. */
  grpc_metadata auth_md;
  size_t auth_md_count;
  /* tls_crl: why a daemon's certificate was refused; NULL without one */
  struct dist_daemon_crl *daemon_crl;
  /* What the public LocalLayer calls and backwards that failed left on
   * daemons that did not answer: their invocations, and outputs and
   * gradients under names libdist made up (a caller's names are the
   * caller's to delete or reuse). */
  dist_later later;
};

struct dist_mesh {
  dist_mesh_desc d;
};

struct dist_tensor {
  char name[256];
  dist_dtype dtype;
  dist_shape shape;
  dist_mesh mesh;
  dist_placement placements[DIST_MAX_MESH_DIMS];
  /* An SPMD trainer's handle of a tensor whose mesh it is not in (made by
   * the operation, spmd_outside.c): its piece is empty, and no daemon is
   * asked for it. Not derived from the mesh alone: a handle of per-rank
   * values names one rank's mesh, while every daemon holds a piece. */
  int no_piece;
  /* The version the daemon that described it reported (dist_tensor_version);
   * 0: none did, or a listing's daemons reported different ones. */
  uint64_t version;
};

/* One request of a fan-out: sent to daemon `target`; on return reply is the
 * unpacked reply (free with protobuf_c_message_free_unpacked) or NULL, and
 * err says why. applied is 1 when the daemon answered success, also when
 * its reply could not be unpacked here: what the call stores is then in
 * the daemon, and an undo must not go by reply alone. unanswered is 1
 * when the daemon said nothing (no reply within the deadline, or the
 * connection lost): it may have applied the call all the same, and only a
 * later question tells. */
typedef struct dist_call {
  int target;
  const ProtobufCMessage *request;
  ProtobufCMessage *reply;
  dist_errbuf err;
  int applied;
  int unanswered;
} dist_call;

/* Sends every call concurrently and waits for all of them, within the
 * client's deadline. Returns 0 when all succeeded; otherwise the first
 * failure's code, with c->err naming the daemon ("rank 1 (127.0.0.1:7473):
 * ..."). Replies of successful calls are set either way. */
int dist_call_many(dist_client *c, const char *method,
                   const ProtobufCMessageDescriptor *reply_desc,
                   dist_call *calls, int n);
void dist_calls_free(dist_call *calls, int n);
/* Whether any of calls[0..n) was applied by its daemon: for a voted call
 * (a reshard, a checkpoint load), whose daemons all apply it or none do,
 * one daemon's success means every daemon stored it, even when another's
 * reply was lost and the call as a whole failed. */
int dist_calls_any_applied(const dist_call *calls, int n);
/* How errors name daemon `target`, written to buf: "rank R (HOST:PORT)"
 * for a client of a cluster, "distd at HOST:PORT" for a client of one
 * endpoint, whose position in the client is not the daemon's rank.
 * Returns buf. */
const char *dist_daemon_label(const dist_client *c, int target, char *buf, size_t len);
/* How a message or an output names the daemon at target as a rank:
 * "rank R" with its rank (dist_daemon_rank), or "distd at HOST:PORT" when
 * a client of one endpoint could not learn it. Returns buf. */
const char *dist_rank_label(dist_client *c, int target, char *buf, size_t len);
/* dist_daemon_rank without asking: -1 when a client of one endpoint has
 * not learned its daemon's rank yet. */
int dist_known_daemon_rank(dist_client *c, int rank);
/* Keeps rank as the daemon's of a client of one endpoint (any Info reply
 * of it tells); a no-op for a client of a cluster file. */
void dist_client_learn_rank(dist_client *c, int rank);
/* Whether a call to daemon target got an answer (a reply or the daemon's
 * own error) or went unanswered (gRPC could not reach the daemon, or the
 * deadline passed without a word from it); kept for a client of one
 * endpoint, whose daemon's rank dist_daemon_rank would otherwise ask. */
void dist_client_note_answer(dist_client *c, int target, int answered);
/* dist_daemon_rank for a decision rather than a label (which daemon a
 * mesh's rank is: reach.c): asked even right after a call to the daemon
 * went unanswered, as the daemon may be back and a rank taken as 0 would
 * refuse (or misaddress) a mesh naming its own. c not NULL. */
int dist_daemon_rank_needed(dist_client *c, int rank);
/* dist_init_from_env: 0 when the daemon at position rank says it is rank
 * `rank` of `world`, or does not answer (its first call will say); else
 * -1 with why naming both. Asked through a client of its own (options o),
 * so that c's channels stay as they were. */
int dist_check_own_daemon(const dist_client *c, const dist_opts *o, int rank, int world,
                          char *why, size_t len);
/* Records call's error on c, naming its daemon once; returns its code. */
int dist_call_fail(dist_client *c, const dist_call *call);
/* dist_call_many of one request to each of targets[0..n) (NULL: ranks
 * 0..n-1). *calls holds the replies and each call's error, or is NULL
 * when out of memory; free it with dist_calls_release. */
int dist_call_all(dist_client *c, const char *method, const ProtobufCMessageDescriptor *reply_desc,
                  const ProtobufCMessage *request, const int *targets, int n, dist_call **calls);
/* Pushes the stored gradients grads[k] to params[k] under op_id, as one
 * step applied by every daemon of their meshes or by none
 * (dist_param_push_tensors). */
int dist_param_push_batch(dist_client *c, uint64_t op_id, int n,
                          const dist_tensor *const *params, const char *const *grads,
                          int trainer);
/* Deletes name on the daemons ranks[0..n), best effort: what a failed
 * call stored there, undone; c's error stays the failure's. A delete that
 * was not done and may be later (dist_later_delete_or_note) is noted on
 * later for the next undo point; NULL: not noted (a name the caller gave,
 * or one an SPMD trainer shares). */
void dist_delete_on(dist_client *c, const char *name, const int *ranks, int n,
                    dist_later *later);
/* dist_tensor_delete (c not NULL), a daemon's delete that was not done
 * but may be later (dist_later_worth_retrying) noted on later for it
 * (NULL: not noted). When no daemon that answered holds the name, nothing
 * is deleted, and each daemon that did not answer the look-up (it may
 * hold it) is noted: a retry that finds nothing there counts as done. */
int dist_tensor_delete_noting(dist_client *c, const char *name, dist_later *later);
/* Deletes name on daemon rank; its code (c->err says why), and in
 * *unanswered (NULL: not told) whether the daemon said nothing. */
int dist_delete_one(dist_client *c, const char *name, int rank, int *unanswered);
/* Releases invocation on daemon rank (LocalLayer Release); its code
 * (c->err says why), and in *unanswered (NULL: not told) whether the
 * daemon said nothing. */
int dist_invocation_release_one(dist_client *c, uint64_t invocation, int rank, int *unanswered);
/* Remembers name on rank; without memory for it, deletes it now. */
void dist_later_note(dist_client *c, dist_later *l, const char *name, int rank);
/* Remembers invocation on rank; without memory for it, releases it now. */
void dist_later_note_invocation(dist_client *c, dist_later *l, uint64_t invocation, int rank);
/* Releases invocation on daemon rank now; when that is not done but may
 * be later, notes it on l for the next undo point, a safe retry as
 * invocation ids are never reused: its daemon did not answer (the deadline
 * passed, the request perhaps lost, or gRPC could not reach it), or
 * answered that it did nothing for now (DIST_EUNAVAIL, DIST_ETIMEDOUT of
 * its own: the name held by another request until its deadline). When
 * the daemon did not answer, *silent (0 to start with, one per daemon and
 * undo) gets the code, and while set nothing more is sent to that daemon:
 * each next undo is noted at once (one deadline per silent daemon, not
 * one per item); a daemon that answered is not silent. Its code (c->err
 * says why; *silent's for an undo noted unsent). */
int dist_later_release_or_note(dist_client *c, dist_later *l, uint64_t invocation, int rank,
                               int *silent);
/* The same for a delete of name, noted only with l: NULL for a name the
 * caller gave, which the caller may use again before the retry. */
int dist_later_delete_or_note(dist_client *c, dist_later *l, const char *name, int rank,
                              int *silent);
/* Deletes each name and releases each invocation on its daemon, one not
 * found there taken as done; those that fail but may be done by asking
 * again (dist_later_worth_retrying) stay on the list for the next time,
 * those refused for good are dropped, and, untried, the items of a daemon
 * that did not answer
 * one of them (one deadline a pass per silent daemon, not one per item;
 * one gRPC cannot reach fails at once, and is not asked again either).
 * Returns the first failure (c->err), or 0 with c->err cleared. */
int dist_later_undo(dist_client *c, dist_later *l);
/* Whether call, an undo's delete or release, failed but may be done by
 * asking again (as dist_later_delete_or_note would note it): its daemon
 * did not answer, or answered that it did nothing for now. */
int dist_later_worth_retrying(const dist_call *call);
/* Moves what from still holds (undos worth retrying only: a pass drops
 * the rest) onto to (NULL: dropped) and empties from:
 * a list whose holder ends (a tape's free) leaves its undos to a list
 * that outlives it, the client's. Without memory for a note, that item
 * is undone now. */
void dist_later_hand_over(dist_client *c, dist_later *from, dist_later *to);
/* Drops every item naming name: a tensor stored under it since, which is
 * not the failed call's to undo. */
void dist_later_forget(dist_later *l, const char *name);
/* dist_later_forget of the items on the ranks of m only (NULL: every
 * rank): a tensor stored under name since lies on m's ranks, and a note
 * of name on another rank is still an older tensor's, left there. */
void dist_later_forget_on(dist_later *l, const char *name, const dist_mesh_desc *m);
/* c just stored name on m's ranks (a layer step's output or gradient, a
 * reshard's result, a put, a checkpoint's load): a note of name on c's
 * list for one of them stands for a delete of an older tensor of that
 * name that was not done, or whose reply was lost after it was, and its
 * undo would now delete the new piece there, so it goes
 * (dist_later_forget_on of c->later). */
void dist_later_forget_stored(dist_client *c, const char *name, const dist_mesh_desc *m);
void dist_later_free(dist_later *l);
/* dist_later_undo of the client's own list (dist_client.later), c->err
 * left as it was: what fails but may be done later stays for the next
 * time. */
void dist_client_later_undo(dist_client *c);
/* dist_client_later_undo with the items of the daemons silent[0..n_silent)
 * left untried: each just did not answer the caller's own call (a
 * deadline waited out, or not reached), and an undo point pays one
 * deadline per silent daemon. */
void dist_client_later_undo_skipping(dist_client *c, const int *silent, int n_silent);
/* Whether names libdist made up for a public call may go on the client's
 * list: not an SPMD trainer's, which every trainer shares (one op id
 * sequence): a reply lost here does not make them this trainer's to
 * delete, as the others got theirs. */
int dist_client_later_takes_made_up_names(const dist_client *c);
/* l where c may note names libdist made up that every SPMD trainer makes
 * alike (a layer step's "<layer>.s<k>...", from one op id sequence), else
 * NULL (not noted): a single client's only
 * (dist_client_later_takes_made_up_names). A tape's names
 * ("tape<token>.<serial>...", dist_tape_new) are this process's alone, and
 * an SPMD trainer stores them on its own daemon only, to which no other
 * trainer sends: the tape notes them on its lists whatever the client. */
dist_later *dist_later_of_made_up(const dist_client *c, dist_later *l);
/* dist_calls_free, then the array (NULL is a no-op). */
void dist_calls_release(dist_call *calls, int n);
/* One call to one daemon, within timeout_ms, that leaves c->err as it
 * was: for what libdist asks on the side, in the middle of reporting
 * another call's failure. The reply, or NULL when the call failed. */
ProtobufCMessage *dist_call_aside(dist_client *c, int target, const char *method,
                                  const ProtobufCMessage *request,
                                  const ProtobufCMessageDescriptor *reply_desc,
                                  int64_t timeout_ms);
/* One call to one daemon. */
int dist_call_one(dist_client *c, int target, const char *method,
                  const ProtobufCMessage *request,
                  const ProtobufCMessageDescriptor *reply_desc,
                  ProtobufCMessage **reply);
/* One call to one daemon whose reply is not wanted (an undo's delete or
 * release): its code, c->err saying why, and in *unanswered (NULL: not
 * told) whether the daemon said nothing (dist_call.unanswered: gRPC could
 * not reach it, or the deadline passed without a word), not a failure it
 * answered with. */
int dist_call_one_heard(dist_client *c, int target, const char *method,
                        const ProtobufCMessage *request,
                        const ProtobufCMessageDescriptor *reply_desc, int *unanswered);

/* DIST_EEXIST, naming the rank and its mesh, when a daemon outside m
 * holds name (a one-rank m meeting a one-rank tensor is no clash: per-rank
 * values); DIST_ENOMEM when a daemon could not be asked or answer for want
 * of memory, the client's or its own; else 0. A daemon that does not
 * answer is not counted (tensor_api.c). */
int dist_held_elsewhere(dist_client *c, const char *name, const dist_mesh_desc *m);
/* dist_name_check on a name the caller chose for a tensor `what` makes
 * ("shard_tensor", "output 0"), or names to look up: before a buffer cuts
 * it short. A NULL name is "WHAT: name is NULL". */
int dist_client_check_name(dist_client *c, const char *what, const char *name);
/* A name to look up (a tensor or parameter that may exist): NULL, empty
 * and over-long names no daemon can hold are refused, naming func; names
 * older daemons allowed (not UTF-8, "__metadata__") stay reachable. */
int dist_client_check_lookup(dist_client *c, const char *func, const char *name);
/* dist_shard_tensor in place of any tensor of that name: the daemons of
 * mesh replace theirs when all of them can (each holds both meanwhile),
 * and then those outside it drop theirs. On failure the older tensor is
 * as it was, unless the message says its pieces outside the mesh were not
 * all deleted. */
int dist_shard_tensor_replacing(dist_client *c, const char *name, const void *data,
                                dist_dtype dt, int ndim, const int64_t *shape,
                                const dist_mesh *mesh, const dist_placement *placements,
                                dist_tensor **out);

/* The next op id: identical across SPMD trainers that issue the same
 * sequence of collective operations. */
uint64_t dist_next_op_id(dist_client *c);
/* The last op id taken (the next one is past it). */
uint64_t dist_last_op_id(const dist_client *c);
/* Takes op ids until last is taken: an SPMD operation whose steps may
 * stop early (refused, failed) still takes the ids every trainer counts
 * for it, so that later operations stay in step. */
void dist_take_ids_through(dist_client *c, uint64_t last);
/* Takes the next n op ids (n >= 1); returns the first. */
uint64_t dist_take_ids(dist_client *c, int n);
/* spmd_refuse.c: c->err's code, after an SPMD trainer refused the
 * operation under op_id of the daemons ranks[0..n) itself (c->err says
 * why): its daemon tells the others, so that their trainers fail at once
 * instead of waiting for this rank until their deadline. Ranks the client
 * does not know are left out. A single client, op_id 0, a single rank, or
 * a trainer whose rank is not among them (nobody waits for it) only
 * returns the code. */
int dist_spmd_refused(dist_client *c, uint64_t op_id, const uint32_t *ranks, int n);
/* dist_spmd_refused of an operation that took op ids op_id to op_id +
 * more_ids (a LocalLayer call). */
int dist_spmd_refused_ids(dist_client *c, uint64_t op_id, uint32_t more_ids,
                          const uint32_t *ranks, int n);
/* dist_spmd_refused of an operation on the ranks of mesh m. */
int dist_spmd_refused_on(dist_client *c, uint64_t op_id, const dist_mesh_desc *m);
/* dist_spmd_refused of an operation over group[0..group_size) (every
 * rank when group is NULL; the first DIST_MAX_MESH_RANKS of a longer
 * one), as the collectives and the MoE exchanges take their groups. */
int dist_spmd_refused_group(dist_client *c, uint64_t op_id, const int *group, int group_size);
/* dist_spmd_refused of the operations under op ids first..last, each on
 * every rank (a tape backward's plan): one OpAbort per thousand ids, or
 * one per id to a daemon before 0.2.9. */
int dist_spmd_refused_range(dist_client *c, uint64_t first, uint64_t last);
/* spmd_outside.c: an SPMD trainer outside an operation's mesh or group
 * takes the operation as a no-op success, as Paddle's ranks outside a
 * process mesh or group do, and holds nothing. Whether this trainer is
 * outside mesh m (a single client never is). */
int dist_spmd_outside(const dist_client *c, const dist_mesh_desc *m);
/* 1 when this SPMD trainer is outside group[0..group_size) (NULL: every
 * rank, which it is in), 0 when in it or a single client; DIST_EINVAL
 * naming func when the group names a rank outside the cluster. */
int dist_spmd_outside_group(dist_client *c, const char *func, const int *group,
                            int group_size);
/* An outsider's handle in *out: the whole tensor described, no piece. */
int dist_tensor_outsider(dist_client *c, const char *name, dist_dtype dt,
                         const dist_shape *global, const dist_mesh *mesh,
                         const dist_placement *placements, dist_tensor **out);
/* The global shape Paddle's dtensor_from_local derives from a local one. */
void dist_global_from_local(const dist_mesh_desc *m, const dist_placement *p,
                            const dist_shape *local, dist_shape *global);
/* An outsider's empty result in *out: a malloc'd buffer of no bytes,
 * to free() as a member's; c->err cleared. 0, or DIST_ENOMEM. */
int dist_empty_result(dist_client *c, void **out);
/* An outsider's local piece of t: 0 bytes in a malloc'd *data, each of
 * the ndim entries of shape (when not NULL) 0. */
int dist_empty_local(dist_client *c, const dist_tensor *t, void **data, size_t *nbytes,
                     int64_t *shape);
/* c->err's code, after the tape refused an operation before the call
 * that runs it numbered it (tape.c): an SPMD trainer takes the op ids that
 * call would have taken and has them aborted on the operation's other
 * daemons, as the call does when it refuses; a single client only
 * returns the code. A LocalLayer call of p (none without p: the call
 * takes no id then either), a reshard of t to mesh (NULL: t's). */
int dist_local_layer_refused(dist_client *c, const dist_program *p);
/* The op ids a LocalLayer call of a program with n_outputs outputs takes
 * (program_call.c): its invocation's, then one per output's shape exchange. */
int dist_local_layer_ids(int n_outputs);
/* Whether a LocalLayer call that failed after the daemons stored its
 * outputs keeps them (program_call.c): when it replaced names the caller
 * gave, where the caller's tensors may have stood, which deleting the
 * outputs would lose for good; names made up held nothing of the caller's. */
int dist_local_layer_keeps_failed_outputs(const dist_call_opts *o);
/* dist_local_layer_call for libdist's own callers (a layer step, a
 * gradient sum) whose output names are theirs to drop: a failed call
 * deletes its outputs on the daemons that applied it (answered success,
 * their reply unpacked here or not), whatever opts->replace says; the
 * outputs and invocation of a daemon that did not answer (which may have
 * stored and kept them) go on later, not asked now (that would cost a
 * deadline each); a daemon that answered with a failure stored nothing. */
int dist_local_layer_call_undoing(dist_client *c, dist_program *p, const dist_arg *args,
                                  int nargs, const dist_call_opts *opts,
                                  dist_invocation **inv, dist_tensor **outs,
                                  dist_later *later);
/* dist_backward for libdist's own callers (a tape, a layer step) whose
 * gradient names are theirs to drop: a failed backward deletes each
 * non-empty undo_names[j] on the daemons that applied it (answered
 * success, their reply unpacked here or not), whatever opts->replace
 * says; on a daemon that did not answer (which may have stored them) they
 * go on later, not asked now (that would cost a deadline per name). */
int dist_backward_undoing(dist_client *c, dist_invocation *inv, const dist_arg *out_grads,
                          const dist_backward_opts *opts, dist_tensor **grads,
                          const char *const *undo_names, dist_later *later);
/* dist_global_scatter (scatter 1) or dist_global_gather (0) for libdist's
 * own callers (a tape's backward) whose opts->out_name is theirs to drop,
 * no rows returned: a failed exchange deletes the result it kept on the
 * daemons that applied it, whatever opts->replace says, and notes it on
 * later for the daemons that did not answer (asking them now would cost a
 * deadline). */
int dist_global_exchange_undoing(dist_client *c, int scatter, const void *const *x,
                                 const int64_t *x_rows, dist_dtype dt, int64_t d_model,
                                 const int64_t *const *local_count,
                                 const int64_t *const *global_count, int n_experts,
                                 const int *group, int group_size, const dist_moe_opts *opts,
                                 dist_later *later);
int dist_reshard_refused(dist_client *c, const dist_tensor *t, const dist_mesh *mesh);
/* dist_spmd_refused of inv's backward, refused before dist_backward
 * (which takes no op id: it runs under the invocation's). */
int dist_backward_refused(dist_client *c, const dist_invocation *inv);
/* A new handle of the tensor m describes (tensor_api.c), or NULL when
 * memory runs out. */
dist_tensor *dist_tensor_from_meta(const Dist__V1__TensorMeta *m);
/* Records an error on c and returns code. */
int dist_client_fail(dist_client *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* dist_client_fail of a va_list, for callers that pass on their own
 * format. */
int dist_client_vfail(dist_client *c, int code, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
/* DIST_EINVAL for a public call `func` given no client (c NULL): the
 * message, "FUNC: c is NULL", is the thread's dist_errmsg(NULL).
 * Every public call taking a client starts `if (!c) return
 * dist_no_client(__func__);`. */
int dist_no_client(const char *func);
/* The same for a NULL handle that would have led to the client (a tape),
 * or given to a call that takes no client (a mesh, tensor, program, layer
 * or invocation accessor, a builder): "FUNC: ARG is NULL", read with
 * dist_errmsg(NULL). */
int dist_null_handle(const char *func, const char *arg);
/* code, with the message kept as the thread's dist_errmsg(NULL): how a
 * call that takes no client (a layer builder) says why it failed. */
int dist_thread_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Keeps the first failure r (non-zero) of a run of calls in *first, with
 * c's message: the calls after it, which succeed, clear c->err. */
void dist_note_first_failure(const dist_client *c, int r, dist_errbuf *first);
/* DIST_EINVAL recorded on c as "FUNC: ARG is NULL": a public call given a
 * NULL pointer it must read or write through says which, rather than
 * crashing. Use through DIST_NEED. */
int dist_client_null_arg(dist_client *c, const char *func, const char *arg);
/* 0 when rank names a daemon of c, else DIST_EINVAL recorded as "FUNC: no
 * daemon of rank R (cluster of N)": for the calls that take a position
 * (0 .. dist_world_size - 1: dist_info, dist_health, the inspections). */
int dist_client_check_rank(dist_client *c, const char *func, int rank);
/* reach.c: calls address daemons by their ranks, which for a client of
 * one endpoint is its daemon's own (asked at the first need), not its
 * position 0. The rank the daemon at position is addressed by, without
 * asking (0 for a client of one endpoint that has not learned it). */
int dist_rank_at(dist_client *c, int position);
/* dist_rank_at, asking a client of one endpoint's daemon its rank the
 * first time: the rank at position of those the client reaches, as a NULL
 * group (every rank the client reaches) names them. dist_rank_at serves
 * where a mesh's check has asked already or the rank only labels a call
 * (asking would hold a call to a frozen daemon up a second more). */
int dist_reached_rank(dist_client *c, int position);
/* 1 when the client holds a channel to rank's daemon; a client of one
 * endpoint asks its daemon's rank the first time. */
int dist_client_reaches(dist_client *c, int rank);
/* 0 when the client reaches every rank of m, else DIST_EINVAL naming the
 * first it does not ("mesh names rank 0, but this client only reaches the
 * daemon of rank 1 at HOST:PORT"). */
int dist_check_mesh_reach(dist_client *c, const dist_mesh_desc *m);
/* Refuses rank, which c does not reach (dist_client_reaches said 0), as
 * named by what ("group", "an out_dist_attr"): a client of one endpoint
 * with "WHAT names rank R, but this client only reaches the daemon of rank
 * S at HOST:PORT"; a client of a cluster file in the caller's own words,
 * cluster_fmt and its arguments, as before session 28. DIST_EINVAL. */
int dist_refuse_unreached(dist_client *c, const char *what, int rank, const char *cluster_fmt,
                          ...) __attribute__((format(printf, 4, 5)));
/* dist_client_check_rank of a rank a call addresses a piece by (a mesh
 * rank): 0 when the client reaches it, else DIST_EINVAL naming func: for
 * a client of one endpoint as dist_refuse_unreached words it, with func
 * as what ("dist_dtensor_to_local names rank 0, but this client only
 * reaches ..."). */
int dist_client_check_reach(dist_client *c, const char *func, int rank);
/* 0 for a trainer number >= 0, else DIST_EINVAL recorded as "FUNC:
 * trainer T is negative": the daemons' uint32 would read -1 as
 * 4294967295. */
int dist_client_check_trainer(dist_client *c, const char *func, int trainer);
/* 0 when pointer arg is set, else dist_client_null_arg naming it and the
 * calling function: `if (DIST_NEED(c, grad)) return c->err.code;`. */
#define DIST_NEED(c, arg) ((arg) ? 0 : dist_client_null_arg((c), __func__, #arg))
/* The daemons an operation on mesh m goes to: every rank of the mesh in a
 * single client, this trainer's own daemon in SPMD. */
int dist_targets(dist_client *c, const dist_mesh_desc *m, int *targets);
/* call_args.c: 0 when args[0..n) (arr, to func) can be sent, each entry's
 * values (nvalues of them where set) with data for their elements; else
 * DIST_EINVAL on c naming the entry ("FUNC: args[1].values[0].data is
 * NULL"). args may be NULL only when n is 0. */
int dist_check_call_args(dist_client *c, const char *func, const char *arr,
                         const dist_arg *args, int n, int nvalues);
/* The same check of one entry's values (arr[j].values, nvalues of them;
 * NULL: none), for arrays whose entries hold different counts. */
int dist_check_arg_values(dist_client *c, const char *func, const char *arr, int j,
                          const dist_value *values, int nvalues);
/* tensor_api.c: 1 when a and b lie on one mesh with the same placements. */
int dist_same_layout(const dist_tensor *a, const dist_tensor *b);
/* grad_add.c: out = a + b (b NULL: a copy of a) of stored tensors, as
 * out_name on mesh m with placements pl (the inputs' own, pieces added
 * rank by rank), by a one-op LocalLayer program run once. *out gets the
 * handle. out_name is libdist's own: a failure deletes it where stored
 * (dist_local_layer_call_undoing, later its list). */
int dist_grad_add(dist_client *c, const char *a, const char *b, const dist_mesh_desc *m,
                  const dist_placement *pl, const char *out_name, dist_tensor **out,
                  dist_later *later);
/* Two gradients of one value (named `of` in errors) summed as out_name:
 * more is resharded to acc's placements first, and the sum lies as acc
 * does. Gradients on different meshes are refused. */
int dist_grad_sum(dist_client *c, const char *of, const dist_tensor *acc,
                  dist_tensor *more, const char *out_name, dist_tensor **out,
                  dist_later *later);
/* The op ids dist_grad_add takes (a copy too), and the most dist_grad_sum
 * takes: the tape's backward plans its ids with these (tape_plan.c). */
int dist_grad_add_ids(void);
int dist_grad_sum_ids_max(void);
/* The most state buffers an optimizer keeps per parameter (Adam's m and v;
 * the daemon's DISTD_OPTIM_STATE_MAX). */
#define DIST_OPTIM_STATE_MAX 2
struct Dist__V1__ParamConfigureRequest;
/* param_api.c: a parameter's options from its configure message (its
 * optimizer set). */
void dist_param_opts_from_pb(const struct Dist__V1__ParamConfigureRequest *rq,
                             dist_param_opts *o);
/* param_api.c: makes `name` a parameter configured as cfg says (its
 * optimizer, reduce, consistency and trainers; the rest is ignored) with
 * restored state: nstate buffers of the parameter's global shape and dtype
 * (each daemon gets its slice) and `step` updates applied. How a checkpoint
 * restored onto another layout through the client keeps its state. */
int dist_param_configure_restored(dist_client *c, const char *name,
                                  const struct Dist__V1__ParamConfigureRequest *cfg,
                                  const void *const *whole, int nstate, uint64_t step);
/* param_api.c: rq (with *opt as its optimizer) configuring as opts says
 * (NULL: the defaults), or tuning with keep_state; name and mesh unset. */
struct Dist__V1__OptimizerConfig;
int dist_param_configure_request(dist_client *c, const dist_param_opts *opts, int keep_state,
                                 struct Dist__V1__ParamConfigureRequest *rq,
                                 struct Dist__V1__OptimizerConfig *opt);
/* param_batch.c: every one of params configured as `how` says (its
 * optimizer, reduce, consistency, trainers, keep_state) under op_id, by
 * every daemon of their meshes or by none. */
int dist_param_configure_batch(dist_client *c, uint64_t op_id, int n,
                               const dist_tensor *const *params,
                               const struct Dist__V1__ParamConfigureRequest *how);
/* param_batch.c: dist_param_configure_batch of the parameters named
 * names[0..n) (func's argument) with opts, under the next op id. */
int dist_param_configure_named(dist_client *c, const char *func, int n,
                               const char *const *names, const dist_param_opts *opts);

#endif
