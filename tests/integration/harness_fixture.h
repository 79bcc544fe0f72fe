/* The cluster of a test file: one per test program (each test file is a
 * program of its own, and Criterion runs each test in a process of its
 * own), at file scope so that stop_cluster, the .fini of the suites and
 * tests that use it, stops it even when an assertion ended the test early:
 * no daemon outlives its test, and harness_stop's check that each daemon
 * exited 0 (23 under ASan after a leak of the daemon's) fails the test.
 * test_daemon and test_security start clusters of their own per test. */
#ifndef DIST_TEST_HARNESS_FIXTURE_H
#define DIST_TEST_HARNESS_FIXTURE_H

#include "harness.h"

extern harness cluster;

/* harness_stop_if_started(&cluster), for a .fini (harness_stop resumes a
 * daemon a failed test left frozen). */
void stop_cluster(void);

#endif
