/* Local clusters of distd processes on loopback, for `distctl cluster up`
 * and `distctl launch`. */
#ifndef DISTCTL_LOCAL_CLUSTER_H
#define DISTCTL_LOCAL_CLUSTER_H

/* The most daemons cluster up starts. */
#define DISTCTL_MAX_DAEMONS 64

/* Starts n daemons on free loopback ports with their files under dir
 * (cluster.conf, distd.<rank>.log, distd.<rank>.pid), detached from this
 * process, and waits (bounded by timeout_ms) until every daemon has all its
 * peers connected. Progress goes to stderr unless quiet. With pin, daemon r
 * runs on the r-th CPU this process may use (round robin). On failure the
 * daemons already started are stopped and the message is printed. */
int distctl_cluster_up(const char *dir, int n, int timeout_ms, int quiet, int pin,
                       char **extra_args, int nextra);
/* Stops the daemons whose pid files are in dir (SIGTERM, then SIGKILL after
 * 10 s), checking that each pid is still a distd before signalling it. */
int distctl_cluster_down(const char *dir, int quiet);

#endif
