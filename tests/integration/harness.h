/* Real distd clusters for integration tests: daemons on free loopback
 * ports, in their own temp directory, killed by PID at the end, and by the
 * kernel (SIGKILL, parent-death signal) if the test process dies first. */
#ifndef DIST_TEST_HARNESS_H
#define DIST_TEST_HARNESS_H

#include <pthread.h>
#include <sys/types.h>

#include "dist/dist.h"

#define HARNESS_MAX 8

typedef struct harness {
  int n;
  char dir[256];
  char cluster_file[300];
  pid_t pids[HARNESS_MAX];
  int grpc_port[HARNESS_MAX], peer_port[HARNESS_MAX], http_port[HARNESS_MAX];
  int own_dirs; /* started by harness_start_own_dirs */
  char cluster_id[64]; /* given by harness_start_unique, "" otherwise */
} harness;

/* Picks free ports, writes DIR/cluster.conf and starts n daemons with
 * extra_args (NULL-terminated, may be NULL) appended; waits (bounded, 20 s)
 * until every daemon reports all peers connected. Fails the test on error. */
void harness_start(harness *h, int n, const char *const *extra_args);
/* harness_start, with each daemon in a mount namespace of its own where
 * DIR/ckpt is its own directory (harness_own_dir): one path naming another
 * directory on each daemon, as on hosts that do not share it (daemons
 * started again get theirs again). Returns 1 when started, 0 (nothing
 * started, h->n 0) when this machine allows no mount namespace. */
int harness_start_own_dirs(harness *h, int n, const char *const *extra_args);
/* The directory daemon r sees at DIR/ckpt, as this process sees it. */
void harness_own_dir(const harness *h, int r, char *out, size_t len);
/* DIR, free ports and DIR/cluster.conf for n daemons, none started: for
 * a test that starts each rank with arguments of its own (TLS). */
void harness_prepare(harness *h, int n);
/* Starts (again) the daemon of rank r only; does not wait. */
void harness_start_rank(harness *h, int r, const char *const *extra_args);
/* SIGKILL / SIGTERM one daemon and reap it; returns its exit status as
 * waitpid gives it. */
int harness_kill(harness *h, int r, int sig);
/* Freezes rank r's daemon (SIGSTOP) and waits, bounded by timeout_ms,
 * until every thread of it has stopped; 1 when it has. SIGCONT resumes
 * it (harness_stop does too). */
int harness_freeze(harness *h, int r, int timeout_ms);
/* Waits, bounded by timeout_ms, until rank r sees `connected` peers. */
int harness_wait_connected(harness *h, int r, int connected, int timeout_ms);
/* Waits (bounded, 20 s a rank) until every rank sees all its h->n - 1
 * peers; fails the test naming the first that does not and `when` (what
 * came before: "after rank 1 restarted"). */
void harness_assert_all_connected(harness *h, const char *when);
/* A single client connected to the whole cluster. */
dist_client *harness_client(harness *h);
/* A single client connected to the whole cluster, with the given
 * deadline (a test that freezes a daemon counts deadlines). */
dist_client *harness_client_deadline(harness *h, long timeout_ms);
/* A single client of the cluster a cluster file names, with the given
 * deadline. */
dist_client *harness_client_of(const char *cluster_file, long timeout_ms);
/* Freezes rank r (harness_freeze, failing the test when it does not
 * stop) and returns the time, for harness_resume_within. */
double harness_freeze_timed(harness *h, int r);
/* Resumes rank r (SIGCONT) after a call made while it was frozen since t0
 * and which returned rc; fails the test unless the call failed (rc < 0)
 * within fewer than `most` deadlines of deadline_ms. */
void harness_resume_within(harness *h, int r, double t0, int rc, double most,
                           long deadline_ms);
/* A client for one daemon, with the given deadline. */
dist_client *harness_client_rank(harness *h, int r, long timeout_ms);
/* A client of rank r's daemon alone (deadline timeout_ms) whose call to
 * it went unanswered: the daemon is frozen (harness_freeze) and an Info
 * call waited out the deadline (DIST_ETIMEDOUT); fails the test
 * otherwise. The daemon stays frozen: SIGCONT resumes it (harness_stop
 * does too). */
dist_client *harness_client_whose_call_went_unanswered(harness *h, int r, long timeout_ms);
/* Stops every daemon still running (SIGTERM, then SIGKILL after 5 s) and
 * removes the directory. */
void harness_stop(harness *h);
/* harness_start with "--cluster-id ID" before extra_args, ID made of
 * prefix, this process's id and the time in ms (kept in h->cluster_id),
 * so that no daemon of another run joins the cluster. */
void harness_start_unique(harness *h, int n, const char *prefix, const char *const *extra_args);
/* harness_start, and a client of the whole cluster (harness_client). */
dist_client *harness_start_with_client(harness *h, int n, const char *const *extra_args);
/* harness_start_unique, and a client of the whole cluster. */
dist_client *harness_start_unique_with_client(harness *h, int n, const char *prefix,
                                              const char *const *extra_args);
/* harness_start_rank of rank r with the cluster id harness_start_unique
 * gave the cluster, then extra_args. */
void harness_start_rank_again(harness *h, int r, const char *const *extra_args);
/* harness_stop of a cluster that was started and not yet stopped, for a
 * test's .fini, which runs also when an assertion ended the test early
 * or before it started one: no daemon outlives its test. */
void harness_stop_if_started(harness *h);
/* Runs `distctl cluster down --dir dir` once this test process has ended,
 * however it ends (a failed cr_assert, Criterion's timeout, meson's):
 * the daemons `distctl cluster up` starts run in a session of their own
 * and would outlive it. Call it before the cluster up; a cluster the
 * test stopped itself is found stopped, which does no harm. */
void harness_cluster_down_at_exit(const char *dir);
/* Picks a free loopback TCP port. */
int harness_free_port(void);
/* Runs a command line through /bin/sh, capturing stdout and stderr
 * (malloc'd, may be NULL) with a timeout; returns the exit status, or -1. */
int harness_run(const char *cmd, char **out, char **err, int timeout_s);
/* Paths of the built binaries ($DIST_DISTD_BIN, $DIST_DISTCTL_BIN). */
const char *harness_distd(void);
const char *harness_distctl(void);
/* The reference generator of global_scatter / global_gather cases
 * (tests/reference/global_scatter_ref.py, under $DIST_SOURCE_ROOT). */
const char *harness_reference_script(void);
/* An SPMD trainer's client for `rank`, made by dist_init_from_env with
 * DIST_RANK, DIST_WORLD_SIZE, DIST_CLUSTER and DIST_JOB_ID=job set (call it
 * from one thread: it sets the environment). */
dist_client *harness_spmd_client(harness *h, int rank, const char *job);
/* The same through another cluster file of n daemons (a relay's). */
dist_client *harness_spmd_client_of(const char *cluster_file, int n, int rank, const char *job);
/* An SPMD trainer of `rank` running one all_reduce over group (int64
 * values rank, 10 * rank, 1, summed) in a thread of its own. done turns 1
 * when it has returned; rc and msg say how (a wrong sum is DIST_EINTERNAL). */
typedef struct harness_reduce {
  dist_client *c;
  const int *group;
  int n, rank, rc, done;
  char msg[600];
  pthread_t thread;
} harness_reduce;
/* Makes the trainer's client (harness_spmd_client, so from one thread)
 * and starts its thread. */
void harness_reduce_start(harness_reduce *r, harness *h, int rank, const int *group, int n,
                          const char *job);
/* Waits for the thread, closes the client; returns rc. */
int harness_reduce_join(harness_reduce *r);
/* Every rank of group runs one all_reduce, as trainers of job: each must
 * succeed (cr_expect, naming `when`). */
void harness_expect_all_reduce(harness *h, const int *group, int n, const char *job,
                               const char *when);
/* An SPMD trainer of rank `rank` among n, one per daemon, all-reduces
 * rank + 1 over them all: 1 when the sum is right, which it is only when
 * every trainer took the same op ids before (each must call it). */
int harness_in_step(dist_client *c, int rank, int n);
/* name as daemon r alone describes it, asked through a client of that
 * daemon only: 0 and *t (free with dist_tensor_free), or the error code
 * opening it (*t NULL). */
int harness_open_on(harness *h, int r, const char *name, dist_tensor **t);
/* dist_shard_tensor of data with the mesh and placements written as text
 * ("[[0,1],[2,3]]", "Shard(0),Replicate()"): its result, and *t (NULL on
 * error). */
int harness_try_put(dist_client *c, const char *name, dist_dtype dt, const void *data, int ndim,
                    const int64_t *shape, const char *mesh_text, const char *placements,
                    dist_tensor **t);
/* harness_try_put that fails the test on error. */
dist_tensor *harness_put(dist_client *c, const char *name, dist_dtype dt, const void *data,
                         int ndim, const int64_t *shape, const char *mesh_text,
                         const char *placements);
/* The 1-d mesh of ranks 0 .. n-1 (free with dist_mesh_free). */
dist_mesh *harness_line_mesh(int n);
/* Fails the test unless tensor name's whole value is exactly want (nbytes). */
void harness_expect_value(dist_client *c, const char *name, const void *want, size_t nbytes);
/* How many names in dir contain infix ("" for any) and end in suffix. */
int harness_count_files(const char *dir, const char *infix, const char *suffix);
/* rm -rf of dir, bounded (30 s); its exit status, as harness_run gives it. */
int harness_remove_dir(const char *dir);
/* CLOCK_MONOTONIC in seconds, and a sleep: for the tests' bounded waits. */
double harness_now_s(void);
void harness_sleep_ms(int ms);
/* Waits until every *counters[i] (updated by other threads with atomic
 * increments) is above 0, for at most timeout_ms; 1 if they all are. */
int harness_wait_all_positive(int *const *counters, int n, int timeout_ms);
/* A client of its own resharding one tensor in place, alternately to
 * Shard(0) and Replicate() on its mesh, until harness_churn_stop; it
 * counts the reshards applied (any other outcome is allowed). */
typedef struct harness_churn {
  harness *h;
  char name[64];
  volatile int stop;
  int applied;
  pthread_t thread;
} harness_churn;
void harness_churn_start(harness_churn *ch, harness *h, const char *name);
/* Waits, bounded by timeout_ms, until the churner applied a reshard; 1 if
 * it did. */
int harness_churn_wait_started(harness_churn *ch, int timeout_ms);
/* Stops the churner; returns the reshards it applied. */
int harness_churn_stop(harness_churn *ch);

/* Rank r's /metrics text (malloc'd), through curl, bounded; fails the
 * test when it cannot be read. */
char *harness_metrics(const harness *h, int r);
/* The value of sample (a name and its labels as written:
 * `x_total{a="b"}`) in a /metrics text, or -1 when it has no such line. */
double harness_metric_sample(const char *metrics, const char *sample);
/* Calls of method ("Info", "LocalLayer/Release") a /metrics text counts
 * with status code ("OK", "NOT_FOUND"), or with any code when code is
 * NULL; 0 when none. */
double harness_rpc_count(const char *metrics, const char *method, const char *code);

/* Size of rank r's log now, to look only at what it logs afterwards. */
long harness_log_size(const harness *h, int r);
/* Waits, bounded by timeout_ms, until rank r's log from byte `from` on
 * holds a line containing every one of the NULL-terminated needles;
 * returns 1 when it does. */
int harness_log_wait(const harness *h, int r, long from, const char *const *needles,
                     int timeout_ms);

/* Waits, bounded by timeout_ms, until daemon r runs an operation of kind
 * ("vote", "reshard" ...) whose op id is not not_op (0: any); 1 if it
 * does. A request in its vote holds the names it stores (daemon/holds.h). */
int harness_wait_running(dist_client *c, int r, const char *kind, uint64_t not_op,
                         int timeout_ms);
/* The op id of the newest operation of kind daemon r finished, 0 if none. */
uint64_t harness_last_finished(dist_client *c, int r, const char *kind);
/* OpAbort of op_id and the more_ids ids after it on the daemons of
 * ranks[0..n), asked of daemon via as its trainer would: the others' waits
 * under those ids fail at once. The ids via says it aborted; fails the
 * test when the call does. */
uint32_t harness_op_abort(harness *h, int via, uint64_t op_id, uint32_t more_ids,
                          uint32_t *ranks, size_t n, const char *reason);

/* A LocalLayer program: y = x + x of a float64 x, its output Replicate on
 * [0, 1] (or Shard(0) when sharded: the daemons then exchange the
 * output's local shapes before the vote). */
dist_program *harness_doubler(int sharded);

#endif
