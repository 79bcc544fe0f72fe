/* A relay in front of one daemon's gRPC port that can hold back the
 * daemon's replies: a call through it is carried out by the daemon, but
 * its answer does not reach the client until the hold ends, so the client
 * gives up at its deadline not knowing. That is a daemon that stored what
 * a call made and whose reply was lost (frozen between its store and its
 * answer, or its connection dropped), made at a known call rather than at
 * a moment SIGSTOP would have to hit. */
#ifndef DIST_TEST_REPLY_HOLD_H
#define DIST_TEST_REPLY_HOLD_H

#include "harness.h"

typedef struct reply_hold reply_hold;

/* The client deadline the tests give reply_hold_cluster: long enough for
 * the calls that must succeed (a put, a register, rank 0's part of an
 * Invoke, which waits for rank 1's vote) on a loaded 2-core machine, short
 * enough that each call held past it costs the test little. */
enum { REPLY_HOLD_DEADLINE_MS = 3000 };

/* harness_start(h, n, NULL), a relay (a thread of this process, on a free
 * loopback port) to rank r, and in *c a client of the cluster with rank r
 * reached through the relay, with the given deadline. Fails the test on
 * error. */
reply_hold *reply_hold_cluster(harness *h, int n, int r, long timeout_ms, dist_client **c);
/* reply_hold_cluster with the daemons started with extra_args
 * (harness_start's). */
reply_hold *reply_hold_cluster_with(harness *h, int n, int r, long timeout_ms,
                                    const char *const *extra_args, dist_client **c);
/* The cluster file whose rank r is reached through the relay (that of
 * reply_hold_cluster's client), for other clients to use. */
const char *reply_hold_cluster_file(const reply_hold *p);
/* Closes c, stops the relay p and the cluster h (harness_stop_if_started,
 * so that a .fini stopping h again does nothing). */
void reply_hold_cluster_stop(harness *h, reply_hold *p, dist_client *c);
/* From the n-th call sent through the relay after this (1: the next one),
 * the daemon's bytes stay in the relay's socket until reply_hold_release.
 * Calls are counted as the client opens their HTTP/2 streams. */
void reply_hold_from_call(reply_hold *p, int n);
/* Holds the daemon's bytes from call `from` (counted as above) until the
 * client sends call `until`: the calls from..until-1 go unanswered at
 * their deadline (the client sends each after the one before failed),
 * and those from `until` on are answered. */
void reply_hold_calls(reply_hold *p, int from, int until);
/* From the n-th call on, the client's bytes do not reach the daemon: the
 * call and those after it are never carried out, as when a connection is
 * lost before the request went through. reply_hold_release then closes
 * that connection (its bytes cannot be sent late: the daemon would carry
 * out a call its client gave up on), and returns once the client has
 * connected again (a health check through it answered, within 10 s). */
void reply_hold_requests_from_call(reply_hold *p, int n);
/* From now on the relay closes its connections to the daemon and each
 * new one at once, as a daemon that is down would refuse them: calls
 * fail unanswered (DIST_EUNAVAIL, gRPC could not reach the daemon), and
 * the daemon, up all along, keeps what it holds. reply_hold_release ends
 * it, and returns once the client has connected again (a health check
 * through it answered, within 10 s). Returns once the relay has closed
 * the connections it had, so that no call after reaches the daemon. */
void reply_hold_refuse(reply_hold *p);
/* The calls the client sent through the relay since the last hold was
 * set, held or dropped ones included. */
int reply_hold_calls_seen(reply_hold *p);
/* Lets everything held, and what follows, through. */
void reply_hold_release(reply_hold *p);
/* Whether the hold is on (the n-th call has been sent, and a hold of
 * reply_hold_calls has not ended). */
int reply_hold_holding(reply_hold *p);
/* Names held by rank r's daemon (asked directly) that start with prefix
 * and end with suffix (either may be ""): how many. */
int reply_hold_count_on(harness *h, int r, const char *prefix, const char *suffix);
/* The LocalLayer invocations rank r's daemon keeps for a backward (its
 * /metrics gauge distd_invocations_kept, read directly). */
int reply_hold_invocations_on(harness *h, int r);

#endif
