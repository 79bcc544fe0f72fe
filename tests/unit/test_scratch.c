/* Scratch buffers (daemon/scratch.c): large ones come back on the next
 * request, small ones are not kept, and idle ones are given back. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "clock.h"
#include "scratch.h"

#define MIB ((size_t)1 << 20)

static void drop_all(void) { distd_scratch_trim(0, 0); }

TestSuite(scratch, .fini = drop_all);

Test(scratch, a_large_buffer_is_handed_out_again) {
  char *a = distd_scratch_get(48 * MIB);
  cr_assert_not_null(a);
  cr_assert_eq((uintptr_t)a % 64, 0, "64-byte aligned");
  memset(a, 1, 48 * MIB);
  distd_scratch_put(a);
  cr_assert_eq(distd_scratch_kept_bytes(), 48 * MIB);
  char *b = distd_scratch_get(40 * MIB); /* a smaller request fits in it */
  cr_assert_eq(b, a);
  cr_assert_eq(distd_scratch_kept_bytes(), 0);
  distd_scratch_put(b);
}

Test(scratch, the_smallest_kept_buffer_that_fits_is_chosen) {
  char *big = distd_scratch_get(64 * MIB), *small = distd_scratch_get(8 * MIB);
  distd_scratch_put(big);
  distd_scratch_put(small);
  char *got = distd_scratch_get(4 * MIB);
  cr_assert_eq(got, small);
  char *too_big = distd_scratch_get(65 * MIB); /* nothing kept fits: fresh */
  cr_assert(too_big != big && too_big != NULL);
  distd_scratch_put(got);
  distd_scratch_put(too_big);
}

Test(scratch, small_buffers_are_not_kept) {
  char *a = distd_scratch_get(DISTD_SCRATCH_MIN - 1);
  cr_assert_not_null(a);
  distd_scratch_put(a);
  cr_assert_eq(distd_scratch_kept_bytes(), 0);
  distd_scratch_put(NULL);
  char *z = distd_scratch_get(0);
  cr_assert_not_null(z, "a zero-byte request still gets a valid pointer");
  distd_scratch_put(z);
}

Test(scratch, a_full_cache_keeps_the_larger_buffers) {
  char *b[DISTD_SCRATCH_SLOTS + 1];
  for (int i = 0; i <= DISTD_SCRATCH_SLOTS; i++) b[i] = distd_scratch_get((size_t)(i + 1) * MIB);
  for (int i = 0; i <= DISTD_SCRATCH_SLOTS; i++) distd_scratch_put(b[i]);
  size_t expect = 0; /* the 1 MiB one was evicted */
  for (int i = 1; i <= DISTD_SCRATCH_SLOTS; i++) expect += (size_t)(i + 1) * MIB;
  cr_assert_eq(distd_scratch_kept_bytes(), expect);
}

Test(scratch, idle_buffers_are_given_back_and_busy_ones_stay) {
  char *a = distd_scratch_get(2 * MIB);
  distd_scratch_put(a);
  int64_t now = distd_now_ms();
  distd_scratch_trim(now, DISTD_SCRATCH_IDLE_MS);
  cr_assert_eq(distd_scratch_kept_bytes(), 2 * MIB, "put just now: not idle yet");
  distd_scratch_trim(now + DISTD_SCRATCH_IDLE_MS, DISTD_SCRATCH_IDLE_MS);
  cr_assert_eq(distd_scratch_kept_bytes(), 0);
}
