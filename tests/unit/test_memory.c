/* The daemon's heap policy (daemon/memory.c): a large block freed by one
 * operation is reused by the next without page faults, and freed memory
 * goes back to the system once the daemon is idle. */
#include <criterion/criterion.h>

#include "heap_probe.h"
#include "memory.h"

Test(memory, without_the_policy_a_large_block_faults_again) {
  GLIBC_MALLOC_ONLY();
  /* The control: glibc's default gives the block back at free. */
  long faults = faults_of_second_block();
  cr_assert_gt(faults, 100, "%ld faults", faults);
}

Test(memory, with_the_policy_a_large_block_is_reused_without_faults) {
  GLIBC_MALLOC_ONLY();
  distd_memory_policy_init();
  long faults = faults_of_second_block();
  cr_assert_lt(faults, 100, "%ld faults for a reused %zu MiB block", faults, BLOCK / MIB);
}

Test(memory, freed_memory_goes_back_after_an_idle_period) {
  GLIBC_MALLOC_ONLY();
  distd_memory_policy_init();
  char *a = malloc(BLOCK);
  cr_assert_not_null(a);
  touch(a, 1);
  free(a);
  long kept = resident_bytes();
  int64_t t = 1000;
  cr_assert_eq(distd_memory_tick(t, 7, 0), 0);
  cr_assert_eq(distd_memory_tick(t + DISTD_MEMORY_IDLE_MS - 1, 7, 0), 0, "not idle long enough");
  cr_assert_gt(resident_bytes(), kept - (long)MIB, "nothing given back yet");
  cr_assert_eq(distd_memory_tick(t + DISTD_MEMORY_IDLE_MS, 7, 0), 1);
  long after = resident_bytes();
  cr_assert_lt(after, kept - (long)(BLOCK / 2), "resident %ld -> %ld bytes", kept, after);
  cr_assert_eq(distd_memory_tick(t + 3 * DISTD_MEMORY_IDLE_MS, 7, 0), 0, "once per idle period");
}

Test(memory, activity_restarts_the_idle_period) {
  int64_t t = 1000;
  distd_memory_tick(t, 1, 0);
  cr_assert_eq(distd_memory_tick(t + DISTD_MEMORY_IDLE_MS, 1, 1), 0, "an RPC in progress");
  cr_assert_eq(distd_memory_tick(t + DISTD_MEMORY_IDLE_MS + 5, 2, 0), 0, "an RPC done since");
  cr_assert_eq(distd_memory_tick(t + 2 * DISTD_MEMORY_IDLE_MS, 2, 0), 0);
  cr_assert_eq(distd_memory_tick(t + 2 * DISTD_MEMORY_IDLE_MS + 5, 2, 0), 1);
}
