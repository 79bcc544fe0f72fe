/* The daemon's one clock: CLOCK_MONOTONIC, in the unit each caller needs
 * (deadlines in ms, PING stamps and spins in ns, uptimes and op times in
 * seconds), and condition variables that wait on it. */
#ifndef DISTD_CLOCK_H
#define DISTD_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

uint64_t distd_now_ns(void);
int64_t distd_now_ms(void);
double distd_now_s(void);
/* ms milliseconds as a timespec (a deadline on this clock, or a span). */
struct timespec distd_ms_timespec(int64_t ms);
/* Arms timerfd fd (of this clock) to expire once, ms from now; returns
 * what timerfd_settime returns. */
int distd_timerfd_arm_ms(int fd, int64_t ms);
/* Reads timerfd fd's expiry count, which clears it: 1 when it had expired,
 * 0 when not (armed again since it became readable). */
int distd_timerfd_expired(int fd);
/* pthread_cond_init whose timed waits take CLOCK_MONOTONIC deadlines. */
void distd_cond_init_monotonic(pthread_cond_t *cond);
/* pthread_cond_timedwait on such a condvar until deadline_ms (distd_now_ms
 * clock); returns what pthread_cond_timedwait returns. */
int distd_cond_wait_until_ms(pthread_cond_t *cond, pthread_mutex_t *mu,
                             int64_t deadline_ms);

#endif
