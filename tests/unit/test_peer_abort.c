/* Aborts of a range of op ids on the peer data plane (distd_abort_range):
 * one ABORT_RANGE frame to each peer that announced it reads one, an
 * ABORT per refusal step per id to a peer that did not (a daemon built
 * before them: old_peer.h), the aborted ids failing at once on every peer
 * either way, and later ids working. Real sockets on loopback. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "old_peer.h"
#include "peer_fixture.h"
#include "subop.h"

static int64_t in_ms(int64_t ms) { return distd_now_ms() + ms; }

/* A receive on rank `on` of op_id from rank 0: its code within wait_ms,
 * and how long it took in *took_ms. */
static int recv_code(peer_fixture *f, int on, uint64_t op_id, int64_t wait_ms, int64_t *took_ms,
                     dist_errbuf *eb) {
  uint8_t dst[8];
  int64_t t0 = distd_now_ms();
  distd_xfer *r = distd_xfer_new(f->r[on].peers, op_id);
  distd_xfer_recv(r, 0, 0, dst, 8);
  int rc = distd_xfer_wait(r, in_ms(wait_ms), eb);
  distd_xfer_free(r);
  *took_ms = distd_now_ms() - t0;
  return rc;
}

/* Rank 0's frames of kind written to rank `to`, once they stop growing
 * toward want (bounded: 5 s). */
static uint64_t frames_sent(peer_fixture *f, int to, unsigned kind, uint64_t want) {
  distd_peer_stats st;
  int64_t end = in_ms(5000);
  do {
    distd_peers_get_stats(f->r[0].peers, to, &st);
    if (st.frames_sent[kind] >= want) break;
    usleep(10 * 1000);
  } while (distd_now_ms() < end);
  return st.frames_sent[kind];
}

/* Each of ids[] on rank `on` is aborted: fails at once, naming rank 0
 * and the reason; or is not: its receive waits out its 200 ms. */
static void expect_ids(peer_fixture *f, int on, const uint64_t *ids, size_t n, int aborted) {
  for (size_t i = 0; i < n; i++) {
    dist_errbuf eb = DIST_ERRBUF_INIT;
    int64_t took;
    int rc = recv_code(f, on, ids[i], aborted ? 10000 : 200, &took, &eb);
    cr_expect_eq(rc, aborted ? DIST_ECANCELED : DIST_ETIMEDOUT, "rank %d, op %llu: %s", on,
                 (unsigned long long)ids[i], eb.msg);
    if (!aborted) continue;
    cr_expect_lt(took, 2000, "rank %d waited %lld ms for op %llu", on, (long long)took,
                 (unsigned long long)ids[i]);
    cr_expect(strstr(eb.msg, "rank 0 aborted op") && strstr(eb.msg, "plan refused"),
              "rank %d: %s", on, eb.msg);
  }
}

/* Rank 0 sends 8 bytes to rank `to` under op_id: it arrives. */
static void expect_served(peer_fixture *f, int to, uint64_t op_id) {
  uint8_t src[8] = {1, 2, 3, 4, 5, 6, 7, 8}, dst[8] = {0};
  distd_xfer *s = distd_xfer_new(f->r[0].peers, op_id);
  distd_xfer *r = distd_xfer_new(f->r[to].peers, op_id);
  distd_xfer_recv(r, 0, 0, dst, 8);
  distd_xfer_send(s, to, 0, src, 8);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_expect_eq(distd_xfer_wait(s, in_ms(10000), &eb), 0, "op %llu, sender: %s",
               (unsigned long long)op_id, eb.msg);
  cr_expect_eq(distd_xfer_wait(r, in_ms(10000), &eb), 0, "op %llu, rank %d: %s",
               (unsigned long long)op_id, to, eb.msg);
  cr_expect_eq(memcmp(src, dst, 8), 0);
  distd_xfer_free(s), distd_xfer_free(r);
}

#define FIRST 9000u
#define COUNT 1000u
#define LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Ids of the range and steps of them, on both ends and in the middle. */
static const uint64_t *told_ids(void) {
  static uint64_t ids[5];
  ids[0] = FIRST;
  ids[1] = FIRST + COUNT - 1;
  ids[2] = FIRST + COUNT / 2;
  ids[3] = distd_subop(FIRST + 1, DISTD_STEP_VOTE);
  ids[4] = distd_subop(FIRST + COUNT / 2, DISTD_STEP_RESHARD_LAYOUT);
  return ids;
}

/* Next to the range, or a step a refusal does not abort. */
static const uint64_t *untold_ids(void) {
  static uint64_t ids[3];
  ids[0] = FIRST + COUNT;
  ids[1] = FIRST - 1;
  ids[2] = distd_subop(FIRST + 2, DISTD_STEP_PUSH_BATCH);
  return ids;
}

/* A plan of 1000 ids aborted by rank 0: each peer is written one
 * ABORT_RANGE frame and no ABORT (before, 13 per id: 13000), and on each
 * the ids and their steps fail at once, a receive already waiting under
 * one of them too; the ids around it still work. */
Test(abort_range, a_plan_of_1000_ids_is_one_frame_to_each_peer, .timeout = 60) {
  peer_fixture f;
  fix_setup(&f, 3);
  uint8_t dst[8];
  distd_xfer *waiting = distd_xfer_new(f.r[2].peers, FIRST + 10);
  distd_xfer_recv(waiting, 0, 0, dst, 8);
  int ranks[] = {0, 1, 2};
  distd_abort_range(f.r[0].peers, FIRST, COUNT, ranks, 3, "plan refused");
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int64_t t0 = distd_now_ms();
  cr_expect_eq(distd_xfer_wait(waiting, in_ms(10000), &eb), DIST_ECANCELED, "%s", eb.msg);
  cr_expect_lt(distd_now_ms() - t0, 2000);
  cr_expect_str_eq(eb.msg, "rank 0 aborted op 9010: plan refused");
  distd_xfer_free(waiting);
  for (int to = 1; to < 3; to++) {
    cr_expect_eq(frames_sent(&f, to, DIST_FRAME_ABORT_RANGE, 1), 1, "to rank %d", to);
    cr_expect_eq(frames_sent(&f, to, DIST_FRAME_ABORT, 0), 0, "to rank %d", to);
    expect_ids(&f, to, told_ids(), 5, 1);
    expect_ids(&f, to, untold_ids(), 3, 0);
    expect_served(&f, to, FIRST + COUNT + 1);
  }
  fix_teardown(&f);
}

/* A mixed cluster: rank 2 is a daemon built before ABORT_RANGE (its
 * HELLO_ACK announces nothing). Rank 1 is written one ABORT_RANGE frame;
 * rank 2 an ABORT per refusal step per id, and never a frame of a kind it
 * does not know (which would cost the connection). */
static void per_step_to_an_old_peer(uint64_t first);

Test(abort_range, a_peer_that_does_not_announce_it_gets_an_abort_per_step, .timeout = 60) {
  per_step_to_an_old_peer(FIRST);
}

/* Ids wrap past 2^64 as a range reader's do: the per-step frames of a
 * range across it are all sent (none were: the loop ran from first +
 * count, wrapped below first). */
Test(abort_range, a_range_across_2_to_the_64_is_told_per_step_too, .timeout = 60) {
  per_step_to_an_old_peer(UINT64_MAX - 4);
}

static void per_step_to_an_old_peer(uint64_t first) {
  peer_fixture f;
  fix_prepare(&f, 3);
  static old_peer old; /* 0.5 MiB of read buffers */
  old_peer_start(&old, &f, 2);
  fix_start_rank(&f, 0);
  fix_start_rank(&f, 1);
  distd_peer_stats st0, st1;
  int64_t end = in_ms(10000);
  do {
    usleep(10 * 1000);
    distd_peers_get_stats(f.r[0].peers, 1, &st1);
    distd_peers_get_stats(f.r[0].peers, 2, &st0);
  } while ((!st1.connected || !st0.out_up) && distd_now_ms() < end);
  cr_assert(st1.connected && st0.out_up, "rank 0 did not connect to ranks 1 and 2");
  const uint64_t count = 20;
  unsigned steps[DISTD_REFUSED_STEPS_MAX];
  const uint64_t per_step = count * (uint64_t)distd_refused_steps(steps);
  int ranks[] = {0, 1, 2};
  distd_abort_range(f.r[0].peers, first, count, ranks, 3, "plan refused");
  cr_expect_eq(frames_sent(&f, 2, DIST_FRAME_ABORT, per_step), per_step);
  cr_expect_eq(frames_sent(&f, 2, DIST_FRAME_ABORT_RANGE, 0), 0);
  end = in_ms(5000);
  while (old_peer_frames(&old, 0, DIST_FRAME_ABORT) < per_step && distd_now_ms() < end)
    usleep(10 * 1000);
  cr_expect_eq(old_peer_frames(&old, 0, DIST_FRAME_ABORT), per_step);
  cr_expect_eq(old_peer_frames(&old, 0, OLD_PEER_KIND_UNKNOWN), 0,
               "rank 2 was sent a frame kind it does not read");
  cr_expect_eq(frames_sent(&f, 1, DIST_FRAME_ABORT_RANGE, 1), 1);
  cr_expect_eq(frames_sent(&f, 1, DIST_FRAME_ABORT, 0), 0);
  const uint64_t told[] = {first, first + count - 1, distd_subop(first + 3, DISTD_STEP_VOTE)};
  expect_ids(&f, 1, told, LEN(told), 1);
  fix_teardown(&f);
  old_peer_stop(&old);
}

/* An id that failed here before (its receive timed out: remembered as this
 * rank's own failure) and is then in a range a peer aborts is the peer's
 * abort from then on, as an ABORT of it makes it: a receive posted again
 * under it fails at once instead of waiting for a rank that refused it. */
Test(abort_range, an_id_failed_here_before_then_in_a_peers_range_is_aborted, .timeout = 60) {
  peer_fixture f;
  fix_setup(&f, 2);
  const uint64_t failed_here = FIRST + 5;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int64_t took;
  cr_assert_eq(recv_code(&f, 1, failed_here, 100, &took, &eb), DIST_ETIMEDOUT, "%s", eb.msg);
  int ranks[] = {0, 1};
  distd_abort_range(f.r[0].peers, FIRST, 10, ranks, 2, "plan refused");
  /* Another id of the range failing says rank 1 read the frame. */
  const uint64_t other[] = {FIRST};
  expect_ids(&f, 1, other, 1, 1);
  const uint64_t again[] = {failed_here};
  expect_ids(&f, 1, again, 1, 1);
  fix_teardown(&f);
}
