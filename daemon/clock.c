#include "clock.h"

#include <sys/timerfd.h>
#include <unistd.h>

uint64_t distd_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int64_t distd_now_ms(void) { return (int64_t)(distd_now_ns() / 1000000); }

double distd_now_s(void) { return (double)distd_now_ns() / 1e9; }

struct timespec distd_ms_timespec(int64_t ms) {
  return (struct timespec){(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
}

int distd_timerfd_arm_ms(int fd, int64_t ms) {
  struct itimerspec t = {.it_value = distd_ms_timespec(ms)};
  return timerfd_settime(fd, 0, &t, NULL);
}

int distd_timerfd_expired(int fd) {
  uint64_t expirations;
  return read(fd, &expirations, sizeof expirations) == (ssize_t)sizeof expirations;
}

void distd_cond_init_monotonic(pthread_cond_t *cond) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(cond, &ca);
  pthread_condattr_destroy(&ca);
}

int distd_cond_wait_until_ms(pthread_cond_t *cond, pthread_mutex_t *mu,
                             int64_t deadline_ms) {
  struct timespec ts = distd_ms_timespec(deadline_ms);
  return pthread_cond_timedwait(cond, mu, &ts);
}
