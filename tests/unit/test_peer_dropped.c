/* The records of kept-aside frames dropped unreceived (peer_dropped.h):
 * found by their whole key only, forgotten once taken, after their time,
 * and oldest first past DROPPED_FRAMES, so their memory is bounded. */
#include <criterion/criterion.h>

#include "peer_dropped.h"

static distd_dropped_frames d;

static void fresh(void) { distd_dropped_init(&d); }

static int found(uint64_t op, int src, uint32_t tag) {
  distd_dropped_frame r;
  return distd_dropped_take(&d, op, src, tag, &r);
}

TestSuite(dropped, .init = fresh);

Test(dropped, a_record_is_found_by_its_whole_key_and_taken_once) {
  distd_dropped_note(&d, 7, 2, 3, 1500, 1000);
  cr_expect(!found(7, 2, 4), "another tag");
  cr_expect(!found(7, 1, 3), "another sender");
  cr_expect(!found(8, 2, 3), "another op");
  distd_dropped_frame r;
  cr_assert(distd_dropped_take(&d, 7, 2, 3, &r));
  cr_expect_eq(r.waited_ms, 1500);
  cr_expect_eq(r.dropped_ms, 1000);
  cr_expect(!found(7, 2, 3), "a record taken is forgotten");
}

Test(dropped, records_go_after_their_time_oldest_first) {
  distd_dropped_note(&d, 1, 0, 0, 10, 1000);
  distd_dropped_note(&d, 2, 0, 0, 10, 2000);
  distd_dropped_expire(&d, 2999, 2000);
  cr_expect_eq(d.count, 2, "nothing is 2000 ms old at 2999");
  distd_dropped_expire(&d, 3000, 2000);
  cr_expect(!found(1, 0, 0), "dropped at 1000, kept 2000 ms: gone at 3000");
  cr_expect(found(2, 0, 0), "dropped at 2000: still there at 3000");
}

/* Many keys share buckets: each is still found, and past the bound the
 * oldest are forgotten while the newest stay. */
Test(dropped, past_the_bound_the_oldest_are_forgotten) {
  enum { EXTRA = 100 };
  for (int k = 0; k < DROPPED_FRAMES + EXTRA; k++)
    distd_dropped_note(&d, 500, k % 3, (uint32_t)k, 10, k);
  cr_assert_eq(d.count, DROPPED_FRAMES);
  for (int k = 0; k < EXTRA; k++) cr_expect(!found(500, k % 3, (uint32_t)k), "tag %d kept", k);
  for (int k = EXTRA; k < DROPPED_FRAMES + EXTRA; k++)
    cr_expect(found(500, k % 3, (uint32_t)k), "tag %d lost", k);
}

/* A taken record's ring slot is reused safely when it is the oldest. */
Test(dropped, taken_records_do_not_confuse_the_ring) {
  distd_dropped_note(&d, 1, 0, 0, 10, 0);
  cr_assert(found(1, 0, 0));
  for (int k = 0; k < DROPPED_FRAMES; k++) distd_dropped_note(&d, 2, 0, (uint32_t)k, 10, 1);
  for (int k = 0; k < DROPPED_FRAMES; k++) cr_expect(found(2, 0, (uint32_t)k), "tag %d", k);
  distd_dropped_expire(&d, 1000, 10);
  cr_expect_eq(d.count, 0);
}
