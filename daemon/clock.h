/* The daemon's one clock: CLOCK_MONOTONIC, in the unit each caller needs
 * (deadlines in ms, PING stamps and spins in ns, uptimes and op times in
 * seconds), and condition variables that wait on it. */
#ifndef DISTD_CLOCK_H
#define DISTD_CLOCK_H

#include <pthread.h>
#include <stdint.h>

uint64_t distd_now_ns(void);
int64_t distd_now_ms(void);
double distd_now_s(void);
/* pthread_cond_init whose timed waits take CLOCK_MONOTONIC deadlines. */
void distd_cond_init_monotonic(pthread_cond_t *cond);

#endif
