/* The holds that order requests on one name in a daemon (holds.h): for
 * every pair of kinds, whether the second request is refused, waits or
 * goes ahead, with the rule written out here from the reasons in holds.h
 * rather than read from holds.c's table; a wait ends when the hold is
 * released, or at the deadline with nothing held. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "clock.h"
#include "holds.h"

static distd_holds *h;

static void setup(void) { h = distd_holds_new(3); }
static void teardown(void) { distd_holds_free(h); }

TestSuite(holds, .init = setup, .fini = teardown, .timeout = 60);

#define R DISTD_HOLD_RESHARD
#define RD DISTD_HOLD_READ
#define C DISTD_HOLD_CONFIGURE
#define D DISTD_HOLD_DELETE
#define RS DISTD_HOLD_RESTORE
#define P DISTD_HOLD_PUT
#define O DISTD_HOLD_OUTPUT
#define E DISTD_HOLD_EXPERTS
static const char *const names[] = {"reshard", "read",   "configure", "delete",
                                    "restore", "put",    "output",    "experts"};

typedef enum { GOES, WAITS, REFUSED } outcome;

/* A request that waits for other daemons (reshard, configure, restore,
 * put, a LocalLayer call's outputs) may not wait for another such
 * request; a delete waits for nothing but local holds; a restore holds
 * nothing while it waits, so it may wait for every hold but another
 * restore's, which waits for other daemons while holding. What stores a
 * voted result (a put, an output, an expert layer's parameters) and a
 * reshard's read of its source do not touch each other. */
static outcome expected(distd_hold_kind taking, distd_hold_kind held) {
  if (held == RS) return taking == D ? WAITS : REFUSED;
  if (taking == RS) return WAITS;
  if (taking == D) return held == D ? GOES : WAITS;
  if (held == D) return taking == C ? REFUSED : WAITS;
  int stores = taking == P || held == P || taking == O || held == O || taking == E ||
               held == E;
  if (stores) return taking == RD || held == RD ? GOES : REFUSED;
  if (taking == R) return held == C ? WAITS : REFUSED;
  if (taking == RD) return held == R ? REFUSED : GOES;
  return held == RD ? GOES : REFUSED; /* a configure */
}

/* What taking `taking` on "w" does while `held` is held, with a 150 ms
 * deadline. */
static outcome observe(distd_hold_kind taking, distd_hold_kind held, dist_errbuf *eb) {
  cr_assert_eq(distd_holds_take(h, "w", held, distd_now_ms() + 1000, eb), 0, "%s", eb->msg);
  int64_t t0 = distd_now_ms();
  int rc = distd_holds_take(h, "w", taking, t0 + 150, eb);
  int64_t took = distd_now_ms() - t0;
  if (rc == 0) distd_holds_release(h, "w", taking);
  distd_holds_release(h, "w", held);
  if (rc == 0) return GOES;
  cr_assert_eq(rc, DIST_EUNAVAIL, "%s", eb->msg);
  cr_expect(strstr(eb->msg, "rank 3") && strstr(eb->msg, "nothing was changed"), "%s",
            eb->msg);
  /* Told by what it says, not by how long it took: a refusal stalled on a
   * loaded host took 140 ms too. A wait must have lasted its deadline. */
  if (!strstr(eb->msg, "at the deadline")) return REFUSED;
  cr_expect_geq(took, 140, "waited %lld ms of 150: %s", (long long)took, eb->msg);
  return WAITS;
}

Test(holds, every_pair_of_kinds_follows_the_rule) {
  for (distd_hold_kind taking = 0; taking < DISTD_HOLD_KINDS; taking++)
    for (distd_hold_kind held = 0; held < DISTD_HOLD_KINDS; held++) {
      dist_errbuf eb = DIST_ERRBUF_INIT;
      outcome got = observe(taking, held, &eb), want = expected(taking, held);
      cr_expect_eq(got, want, "%s while a %s runs: got %d, want %d (%s)", names[taking],
                   names[held], got, want, eb.msg);
    }
}

Test(holds, other_names_are_free_and_messages_say_what_runs) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_holds_take(h, "w", R, distd_now_ms() + 1000, &eb), 0, "%s", eb.msg);
  cr_expect_eq(distd_holds_take(h, "v", R, distd_now_ms() + 1000, &eb), 0, "%s", eb.msg);
  distd_holds_release(h, "v", R);
  cr_expect_eq(distd_holds_take(h, "w", R, distd_now_ms() + 1000, &eb), DIST_EUNAVAIL);
  cr_expect(strstr(eb.msg, "'w' is being resharded by another request on rank 3; reshard "
                   "it again"), "%s", eb.msg);
  cr_expect_eq(distd_holds_take(h, "w", C, distd_now_ms() + 1000, &eb), DIST_EUNAVAIL);
  cr_expect(strstr(eb.msg, "configure it again"), "%s", eb.msg);
  distd_holds_release(h, "w", R);
}

/* Releases "w"'s configure hold after 200 ms. */
static void *release_later(void *arg) {
  (void)arg;
  usleep(200 * 1000);
  distd_holds_release(h, "w", C);
  return NULL;
}

Test(holds, a_wait_ends_when_the_hold_is_released) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_holds_take(h, "w", C, distd_now_ms() + 1000, &eb), 0, "%s", eb.msg);
  pthread_t th;
  /* From before the releaser starts: its 200 ms cannot have begun earlier. */
  int64_t t0 = distd_now_ms();
  cr_assert_eq(pthread_create(&th, NULL, release_later, NULL), 0);
  cr_expect_eq(distd_holds_take(h, "w", R, t0 + 10000, &eb), 0, "%s", eb.msg);
  int64_t waited = distd_now_ms() - t0;
  pthread_join(th, NULL);
  cr_expect_geq(waited, 150, "held after %lld ms, before the configure ended",
                (long long)waited);
  cr_expect_lt(waited, 5000, "held only near the deadline (%lld ms)", (long long)waited);
  distd_holds_release(h, "w", R);
}

Test(holds, a_wait_that_times_out_leaves_nothing_held) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_holds_take(h, "w", C, distd_now_ms() + 1000, &eb), 0, "%s", eb.msg);
  cr_expect_eq(distd_holds_take(h, "w", R, distd_now_ms() + 100, &eb), DIST_EUNAVAIL);
  cr_expect(strstr(eb.msg, "still being configured on rank 3 at the deadline"), "%s", eb.msg);
  distd_holds_release(h, "w", C);
  cr_expect_eq(distd_holds_take(h, "w", C, distd_now_ms() + 100, &eb), 0,
               "the timed-out reshard left a hold: %s", eb.msg);
  distd_holds_release(h, "w", C);
}

typedef struct restorer {
  int rc;
  int64_t done_ms; /* when it took its names */
  uint64_t batch;
  pid_t tid; /* its thread's, once it runs */
} restorer;

static void *restore_a_and_b(void *arg) {
  restorer *r = arg;
  __atomic_store_n(&r->tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
  const char *both[2] = {"a", "b"};
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = distd_holds_take_all(h, both, 2, RS, distd_now_ms() + 10000, &r->batch, &eb);
  r->done_ms = distd_now_ms();
  __atomic_store_n(&r->rc, rc, __ATOMIC_RELEASE);
  return NULL;
}

/* The state letter of this process's thread tid (/proc's "S": asleep),
 * 0 when it cannot be read. */
static char thread_state(pid_t tid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  const char *got = fgets(line, sizeof line, f);
  fclose(f);
  const char *end = got ? strrchr(line, ')') : NULL; /* the name may hold spaces */
  return end && end[1] == ' ' ? end[2] : 0;
}

/* Waits, bounded by timeout_ms, until r's thread sleeps or r took its
 * names (or failed); 1 if either. From its start the thread does nothing
 * that sleeps but wait in distd_holds_take_all (whose mutex nobody else
 * takes meanwhile), and distd_holds tells no waiter, so asleep is
 * waiting. */
static int restore_waits_or_ends(const restorer *r, int timeout_ms) {
  for (int64_t until = distd_now_ms() + timeout_ms; distd_now_ms() < until; usleep(1000)) {
    pid_t tid = __atomic_load_n(&r->tid, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&r->rc, __ATOMIC_ACQUIRE) != -1 || (tid && thread_state(tid) == 'S'))
      return 1;
  }
  return 0;
}

/* A restore of "a" and "b" waiting for a reshard of "a" holds neither
 * meanwhile: a reshard of "b" goes ahead, and the restore takes both once
 * both reshards end. */
Test(holds, a_restore_takes_its_names_at_once_and_none_while_it_waits) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_holds_take(h, "a", R, distd_now_ms() + 1000, &eb), 0, "%s", eb.msg);
  restorer r = {-1, 0, 0, 0};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, restore_a_and_b, &r), 0);
  /* Bounded waits: after a fixed 100 ms, a restore not yet started (or
   * not yet woken) on a loaded host let the checks pass untried. */
  cr_assert(restore_waits_or_ends(&r, 10000), "the restore neither waited nor ended");
  cr_assert_eq(__atomic_load_n(&r.rc, __ATOMIC_ACQUIRE), -1,
               "the restore took 'a' while a reshard held it");
  cr_expect_eq(distd_holds_take(h, "b", R, distd_now_ms() + 50, &eb), 0,
               "the waiting restore held 'b': %s", eb.msg);
  distd_holds_release(h, "a", R); /* wakes the restore, which waits again */
  cr_assert(restore_waits_or_ends(&r, 10000), "the restore neither waited nor ended");
  cr_expect_eq(__atomic_load_n(&r.rc, __ATOMIC_ACQUIRE), -1,
               "the restore took 'b' while a reshard held it");
  int64_t b_released_ms = distd_now_ms();
  distd_holds_release(h, "b", R);
  pthread_join(th, NULL);
  cr_expect_eq(r.rc, 0);
  /* Not its own wait's length (it starts when its thread runs, late on a
   * loaded host), but the order: it took its names after 'b' was free. */
  cr_expect_geq(r.done_ms, b_released_ms, "the restore took its names %lld ms before 'b' was "
                "released", (long long)(b_released_ms - r.done_ms));
  cr_expect_eq(distd_holds_take(h, "b", C, distd_now_ms() + 50, &eb), DIST_EUNAVAIL,
               "the restore does not hold 'b'");
  cr_expect(strstr(eb.msg, "'b' is being restored from a checkpoint on rank 3"), "%s",
            eb.msg);
  distd_holds_release_batch(h, r.batch);
  cr_expect_eq(distd_holds_take(h, "b", C, distd_now_ms() + 50, &eb), 0, "%s", eb.msg);
  distd_holds_release(h, "b", C);
}

/* A batch is released whole and alone, and in one pass: an expert layer
 * holds a few names per expert, and releasing 100k names one by one took
 * minutes. */
Test(holds, a_batch_releases_its_own_names_only) {
  enum { N = 100000 };
  static char storage[N][24];
  static const char *many[N];
  for (int i = 0; i < N; i++) {
    snprintf(storage[i], sizeof storage[i], "moe.expert%d.w1", i);
    many[i] = storage[i];
  }
  dist_errbuf eb = DIST_ERRBUF_INIT;
  uint64_t mine = 0, other = 0;
  const char *c_only[1] = {"c"};
  cr_assert_eq(distd_holds_take_all(h, c_only, 1, O, distd_now_ms() + 1000, &other, &eb), 0);
  cr_assert_eq(distd_holds_take_all(h, many, N, E, distd_now_ms() + 1000, &mine, &eb), 0);
  cr_assert_neq(mine, other);
  int64_t t0 = distd_now_ms();
  distd_holds_release_batch(h, mine);
  cr_expect_lt(distd_now_ms() - t0, 2000, "releasing %d names took %lld ms", N,
               (long long)(distd_now_ms() - t0));
  cr_expect_eq(distd_holds_take(h, many[N - 1], C, distd_now_ms() + 50, &eb), 0, "%s", eb.msg);
  distd_holds_release(h, many[N - 1], C);
  cr_expect_eq(distd_holds_take(h, "c", C, distd_now_ms() + 50, &eb), DIST_EUNAVAIL,
               "the other batch's hold went too");
  distd_holds_release_batch(h, other);
}
