/* An ABORT or ABORT_RANGE queued while no memory can be had still reaches
 * the peer (peer_ctl.c: each peer's spare control frames), as often as
 * frames keep leaving: a spare comes back once written. Before, the frame
 * was dropped and the peer waited out its deadline. calloc and malloc
 * are wrapped (-Wl,--wrap) so that this thread's allocations can fail
 * while the loop threads' do not. Real sockets on loopback. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "peer_fixture.h"
#include "peer_internal.h"

void *__real_calloc(size_t n, size_t size);
void *__real_malloc(size_t size);
static _Thread_local int no_memory; /* this thread's callocs and mallocs fail */

void *__wrap_calloc(size_t n, size_t size) { return no_memory ? NULL : __real_calloc(n, size); }
void *__wrap_malloc(size_t size) { return no_memory ? NULL : __real_malloc(size); }

static int64_t in_ms(int64_t ms) { return distd_now_ms() + ms; }

/* A receive on rank 1 of op_id from rank 0, posted now. */
static distd_xfer *waiting_on(peer_fixture *f, uint64_t op_id, uint8_t *dst) {
  distd_xfer *x = distd_xfer_new(f->r[1].peers, op_id);
  distd_xfer_recv(x, 0, 0, dst, 8);
  return x;
}

/* x fails at once (not at its 10 s deadline) with the ABORT rank 0 sent. */
static void expect_aborted(distd_xfer *x, const char *why) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int64_t t0 = distd_now_ms();
  cr_expect_eq(distd_xfer_wait(x, in_ms(10000), &eb), DIST_ECANCELED, "%s", eb.msg);
  cr_expect_lt(distd_now_ms() - t0, 2000, "waited %lld ms", (long long)(distd_now_ms() - t0));
  cr_expect(strstr(eb.msg, "rank 0 aborted op") && strstr(eb.msg, why), "%s", eb.msg);
  distd_xfer_free(x);
}

/* Three times as many ABORTs as a peer has spares, one after the other,
 * each queued with no memory: every one arrives. */
Test(ctl_nomem, an_abort_without_memory_reaches_the_peer, .timeout = 60) {
  peer_fixture f;
  fix_setup(&f, 2);
  int ranks[] = {0, 1};
  uint8_t dst[8];
  for (uint64_t op = 100; op < 100 + 3 * CTL_SPARES; op++) {
    distd_xfer *x = waiting_on(&f, op, dst);
    no_memory = 1;
    distd_abort_op(f.r[0].peers, op, ranks, 2, "out of memory here");
    no_memory = 0;
    expect_aborted(x, "out of memory here");
  }
  fix_teardown(&f);
}

/* Rank 0 refuses count ids from 500 with no memory; rank 1, waiting on
 * op 500 (the range's first: told last when told per id), must hear of
 * it at once. */
static void expect_range_heard(peer_fixture *f, uint64_t count) {
  int ranks[] = {0, 1};
  uint8_t dst[8];
  distd_xfer *x = waiting_on(f, 500, dst);
  no_memory = 1;
  distd_abort_range(f->r[0].peers, 500, count, ranks, 2, "plan refused");
  no_memory = 0;
  expect_aborted(x, "plan refused");
  fix_teardown(f);
}

/* A range's one frame too. */
Test(ctl_nomem, an_abort_range_without_memory_reaches_the_peer, .timeout = 60) {
  peer_fixture f;
  fix_setup(&f, 2);
  expect_range_heard(&f, 20);
}

/* A range of 1000 ids with no memory at all, behind a small socket buffer:
 * its list of ranks came from malloc, and without it every rank was told
 * per step and per id, about 13,000 frames, of which the four spares
 * carried a few and the op's own first id was dropped (a reviewer's
 * find). */
Test(ctl_nomem, a_long_range_without_any_memory_reaches_the_peer, .timeout = 60) {
  peer_fixture f;
  fix_prepare(&f, 2);
  f.socket_buffer = 8192;
  fix_start_all(&f);
  cr_assert(fix_wait_connected(&f, 10000));
  expect_range_heard(&f, 1000);
}

/* Rank 0's stderr, from now on, into a file the test reads (the log line
 * of the dropped frames); stderr's own descriptor back from the result. */
static int capture_stderr(FILE **file) {
  *file = tmpfile();
  cr_assert(*file);
  fflush(stderr);
  int saved = dup(STDERR_FILENO);
  cr_assert(saved >= 0 && dup2(fileno(*file), STDERR_FILENO) >= 0);
  return saved;
}

/* How many times the captured stderr holds want. */
static int stderr_count(FILE *file, const char *want) {
  char text[8192];
  size_t n = (size_t)pread(fileno(file), text, sizeof text - 1, 0);
  text[n == (size_t)-1 ? 0 : n] = 0;
  int count = 0;
  for (const char *at = text; (at = strstr(at, want)) != NULL; at += strlen(want)) count++;
  return count;
}

/* Waits (bounded) until the captured stderr holds want. */
static int stderr_shows(FILE *file, const char *want, int64_t timeout_ms) {
  for (int64_t end = in_ms(timeout_ms); distd_now_ms() < end; usleep(20000))
    if (stderr_count(file, want)) return 1;
  return 0;
}

/* With rank 1 down its frames stay queued, so the spares run out: past
 * CTL_SPARES, frames queued with no memory are dropped, counted in
 * ctl_dropped (distd_peer_ctl_dropped_total) and summed in one log line
 * at the loop's next tick. Before, they went with no trace. */
Test(ctl_nomem, control_frames_past_the_spares_are_counted_and_logged, .timeout = 60) {
  peer_fixture f;
  fix_setup(&f, 2);
  fix_stop_rank(&f, 1);
  distd_peers *p = f.r[0].peers;
  /* Both of rank 0's sockets to rank 1 gone, not only "connected" false:
   * that falls with the inbound one, and an outbound one still open takes
   * a frame, so a spare comes back (seen under load: 2 drops, not 3). */
  distd_peer_stats st;
  for (int64_t end = in_ms(10000); distd_now_ms() < end; usleep(5000)) {
    distd_peers_get_stats(p, 1, &st);
    if (!st.out_up && !st.in_up) break;
  }
  cr_assert(!st.out_up && !st.in_up, "rank 0 still has a socket to rank 1");
  FILE *file;
  int saved = capture_stderr(&file);
  dist_log_current_level = DIST_LOG_WARN;
  enum { EXTRA = 3 };
  dist_frame_header h = {DIST_FRAME_MAGIC, DIST_FRAME_VERSION, DIST_FRAME_ABORT, 700, 0, 0, 4,
                         (uint64_t)(-(int64_t)DIST_ECANCELED)};
  pthread_mutex_lock(&p->mu); /* no redial purges the queue meanwhile */
  no_memory = 1;
  for (int i = 0; i < CTL_SPARES + EXTRA; i++, h.op_id++) distd_peer_queue_ctl(p, 1, &h, "gone", 4);
  no_memory = 0;
  pthread_mutex_unlock(&p->mu);
  distd_peers_get_stats(p, 1, &st);
  cr_expect_eq(st.ctl_dropped, EXTRA);
  char want[64];
  snprintf(want, sizeof want, ": %d ABORT or ABORT_RANGE frame(s) to it dropped", EXTRA);
  cr_expect(stderr_shows(file, want, 5000), "no line saying \"%s\"", want);
  /* The line sums the drops since the last one: the next ticks (every
   * second) have none to tell. */
  usleep(2500 * 1000);
  cr_expect_eq(stderr_count(file, "frame(s) to it dropped"), 1, "the drops were told again");
  dup2(saved, STDERR_FILENO);
  close(saved);
  fclose(file);
  fix_teardown(&f);
}
