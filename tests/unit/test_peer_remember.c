/* A peer's aborted ranges of op ids as remembered (peer_remember.c): a
 * range that meets a live one from the same rank, with the same code and
 * reason (overlapping it, held by it, holding it, continuing it) grows
 * that one to their union instead of taking a slot of its own; ranges of
 * other ranks or reasons, and ranges apart, keep their own. Every id of
 * every range told, and each id's refusal steps, stay aborted; an id
 * outside them does not. Called directly on a zeroed distd_peers, as the
 * loop calls it with the lock held: nothing else runs here. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

#include "peer_internal.h"
#include "subop.h"

static distd_peers *peers_new(void) {
  distd_peers *p = calloc(1, sizeof *p);
  cr_assert_not_null(p);
  return p;
}

static void told(distd_peers *p, uint64_t first, uint64_t count, int from, const char *reason) {
  distd_remember_range(p, first, count, from, DIST_ECANCELED, reason);
}

static int live_ranges(const distd_peers *p) {
  int n = 0;
  for (int i = 0; i < p->ranges_used; i++) n += p->ranges[i].op.at_ms != 0;
  return n;
}

/* Each of in[] is remembered as aborted by rank `by` (with the code
 * told); none of out[] is remembered at all. */
static void expect_ids(distd_peers *p, int by, const uint64_t *in, size_t n_in,
                       const uint64_t *out, size_t n_out) {
  for (size_t i = 0; i < n_in; i++) {
    const remembered_op *r = distd_remembered_find(p, in[i]);
    cr_expect(r && r->aborted_by == by && r->code == DIST_ECANCELED,
              "op %llu is not remembered as aborted by rank %d", (unsigned long long)in[i], by);
  }
  for (size_t i = 0; i < n_out; i++)
    cr_expect_null(distd_remembered_find(p, out[i]), "op %llu is remembered",
                   (unsigned long long)out[i]);
}
#define LEN(a) (sizeof(a) / sizeof((a)[0]))
#define EXPECT_IDS(p, by, in, out) expect_ids(p, by, in, LEN(in), out, LEN(out))

Test(remember, a_range_held_by_another_or_overlapping_its_end_takes_no_new_slot) {
  distd_peers *p = peers_new();
  told(p, 1000, 100, 0, "plan refused");
  told(p, 1020, 10, 0, "plan refused"); /* held by 1000 .. 1099 */
  cr_expect_eq(p->ranges_used, 1, "a range held by another took a slot");
  told(p, 1090, 30, 0, "plan refused"); /* 1090 .. 1119 overlaps the end */
  cr_expect_eq(p->ranges_used, 1, "a range overlapping another's end took a slot");
  const uint64_t in[] = {1000, 1025, 1099, 1100, 1119, distd_subop(1110, DISTD_STEP_VOTE),
                         distd_subop(1000, DISTD_STEP_RESHARD_LAYOUT)};
  const uint64_t out[] = {999, 1120, distd_subop(1110, DISTD_STEP_PUSH_BATCH)};
  EXPECT_IDS(p, 0, in, out);
  free(p);
}

/* The other way round: a range that holds a live one, or overlaps its
 * start, grows it from the front. */
Test(remember, a_range_holding_another_or_overlapping_its_start_takes_no_new_slot) {
  distd_peers *p = peers_new();
  told(p, 5000, 10, 2, "refused");
  told(p, 4990, 40, 2, "refused"); /* 4990 .. 5029 holds 5000 .. 5009 */
  told(p, 4980, 15, 2, "refused"); /* 4980 .. 4994 overlaps the start */
  cr_expect_eq(p->ranges_used, 1);
  const uint64_t in[] = {4980, 4989, 5000, 5029, distd_subop(4980, DISTD_STEP_BACKWARD +
                                                                       DISTD_STEP_VOTE)};
  const uint64_t out[] = {4979, 5030};
  EXPECT_IDS(p, 2, in, out);
  free(p);
}

/* A range that meets two live ones joins them: one slot stays live. */
Test(remember, a_range_bridging_two_leaves_one_live) {
  distd_peers *p = peers_new();
  told(p, 100, 10, 1, "refused");
  told(p, 200, 10, 1, "refused");
  cr_expect_eq(live_ranges(p), 2);
  told(p, 105, 100, 1, "refused"); /* 105 .. 204 */
  cr_expect_eq(live_ranges(p), 1);
  const uint64_t in[] = {100, 150, 209};
  const uint64_t out[] = {99, 210};
  EXPECT_IDS(p, 1, in, out);
  free(p);
}

/* Ranges of another rank, code or reason, and ranges with a gap between
 * them, keep slots of their own, as before. */
Test(remember, ranges_of_other_ranks_or_reasons_or_apart_keep_their_own_slots) {
  distd_peers *p = peers_new();
  told(p, 1000, 100, 0, "plan refused");
  told(p, 1050, 100, 1, "plan refused");
  told(p, 1050, 100, 0, "another reason");
  distd_remember_range(p, 1050, 100, 0, DIST_EPEER, "plan refused");
  told(p, 1101, 10, 0, "plan refused"); /* 1100 is not told: apart */
  cr_expect_eq(p->ranges_used, 5);
  const uint64_t by_1[] = {1120}, gap[] = {1150};
  EXPECT_IDS(p, 1, by_1, gap);
  const remembered_op *r = distd_remembered_find(p, 1010);
  cr_assert_not_null(r);
  cr_expect_str_eq(r->reason, "plan refused");
  free(p);
}

/* Ids count modulo 2^64 (a single client's start at a random base): a
 * range overlapping one that crosses 2^64 - 1 to 0 is its union. */
Test(remember, ranges_across_2_to_the_64_are_joined_too) {
  distd_peers *p = peers_new();
  told(p, UINT64_MAX - 9, 10, 0, "refused"); /* up to 2^64 - 1 */
  told(p, UINT64_MAX - 2, 6, 0, "refused");  /* 2^64 - 3 .. 2 */
  told(p, 1, 1, 0, "refused");               /* held */
  cr_expect_eq(p->ranges_used, 1);
  const uint64_t in[] = {UINT64_MAX - 9, UINT64_MAX, 0, 2, distd_subop(0, DISTD_STEP_VOTE)};
  const uint64_t out[] = {UINT64_MAX - 10, 3};
  EXPECT_IDS(p, 0, in, out);
  free(p);
}

/* A join empties the slots it takes in; a later range takes one of those
 * (or one never written), not a live one: the joined range, told last,
 * stays remembered. */
Test(remember, a_range_after_a_join_takes_an_emptied_slot_not_a_live_one) {
  distd_peers *p = peers_new();
  for (int i = 0; i < REMEMBERED_RANGES; i++) told(p, 1000 + 100 * (uint64_t)i, 10, 0, "refused");
  cr_expect_eq(live_ranges(p), REMEMBERED_RANGES);
  told(p, 1000, 100 * REMEMBERED_RANGES, 0, "refused"); /* bridges all of them */
  cr_expect_eq(live_ranges(p), 1);
  told(p, 900000, 1, 0, "another reason");
  cr_expect_eq(live_ranges(p), 2);
  const uint64_t in[] = {1000, 1005, 1000 + 100 * REMEMBERED_RANGES - 1, 900000};
  const uint64_t out[] = {999, 900001};
  EXPECT_IDS(p, 0, in, out);
  free(p);
}

/* An id next to one the ring of single ids holds makes a range of two;
 * when that pair meets a live range (40 .. 49, then 50 alone in the
 * ring, then 51), it joins it rather than taking a slot of its own. */
Test(remember, a_pair_from_the_ring_joins_the_range_it_meets) {
  distd_peers *p = peers_new();
  distd_remember_op(p, 50, 3, DIST_ECANCELED, "refused");
  told(p, 40, 10, 3, "refused");
  distd_remember_op(p, 51, 3, DIST_ECANCELED, "refused");
  cr_expect_eq(live_ranges(p), 1, "one run of ids took %d slots", live_ranges(p));
  const uint64_t in[] = {40, 49, 50, 51};
  const uint64_t out[] = {39, 52};
  EXPECT_IDS(p, 3, in, out);
  free(p);
}

/* A pair across 2^64 (the ids a client hands out wrap there): MAX and 0
 * make the range MAX .. 0, not 0 .. 1, in either order. */
static void expect_pair_across_the_wrap(uint64_t first, uint64_t second) {
  distd_peers *p = peers_new();
  distd_remember_op(p, first, 3, DIST_ECANCELED, "refused");
  distd_remember_op(p, second, 3, DIST_ECANCELED, "refused");
  const uint64_t in[] = {UINT64_MAX, 0};
  const uint64_t out[] = {1, UINT64_MAX - 1};
  EXPECT_IDS(p, 3, in, out);
  free(p);
}

Test(remember, a_pair_of_single_ids_across_the_wrap_covers_both) {
  expect_pair_across_the_wrap(UINT64_MAX, 0);
  expect_pair_across_the_wrap(0, UINT64_MAX);
}

/* The ring of single ids: an entry taken into a range leaves its slot
 * empty, and the next single id takes that slot rather than the oldest
 * live one (ids 0, 10, 20 ... fill the ring; 11 joins 10 into a range;
 * then 999999 alone: 0 stays remembered). */
Test(remember, a_single_id_takes_a_ring_slot_a_range_emptied) {
  distd_peers *p = peers_new();
  for (uint64_t i = 0; i < REMEMBERED_OPS; i++)
    distd_remember_op(p, 10 * i, 3, DIST_ECANCELED, "refused");
  distd_remember_op(p, 11, 3, DIST_ECANCELED, "refused"); /* 10 .. 11 */
  distd_remember_op(p, 999999, 3, DIST_ECANCELED, "refused");
  const uint64_t in[] = {0, 10, 11, 20, 10 * (REMEMBERED_OPS - 1), 999999};
  const uint64_t out[] = {1, 12, 999998};
  EXPECT_IDS(p, 3, in, out);
  free(p);
}
