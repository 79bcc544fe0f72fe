/* Under AddressSanitizer, every Criterion test ends with a leak check of its
 * own worker process, and a leak fails the test.
 *
 * Why not LeakSanitizer's check at exit: Criterion 2.4 runs each test in a
 * worker process of its own (BoxFort: fork, then exec of the test binary),
 * and the worker tells the runner "test ended" before it exits. The exit-time
 * check comes after that; its report and its exit code (ASAN_OPTIONS
 * exitcode) reach the runner only once the test's result is decided, and the
 * runner ignores them. An assertion made during the test's teardown phase is
 * printed but does not fail the test either.
 *
 * So the test binaries are linked with -Wl,--wrap=criterion_internal_test_main
 * (tests/meson.build): each Test's trampoline calls our wrapper, which runs
 * the test body, then the test's and its suite's fini in the main phase
 * (taking them from the teardown, which would run them again), then
 * __lsan_do_recoverable_leak_check(). Memory that a fini frees is therefore
 * not reported, and a leak made by a fini is. A body that fails a fatal
 * assertion skips all this: its fini runs in the teardown as usual, the test
 * has failed anyway.
 *
 * The check at exit is turned off in the test binaries (its report failed
 * nothing in a worker); in the runner it would see only Criterion's own
 * leaks: 48-byte callocs of the parallel runner, whose one frame in the
 * stripped libcriterion.so has no name a suppression could match without
 * also matching every test's stack (which passes through
 * criterion_internal_test_main). Daemons and distctl are other binaries:
 * their check at exit stays, and the harness fails a test whose daemon
 * exits non-zero. */
#include <criterion/criterion.h>
#include <sanitizer/lsan_interface.h>
#include <stddef.h>
#include <string.h>

typedef void fixture_fn(void);
typedef void param_test_fn(void *);

void __real_criterion_internal_test_main(void (*fn)(void));

static void (*test_body)(void);

/* The worker's copy of a test's extra data is not aligned for its type
 * (UBSan says so), hence memcpy rather than member access. */
static void *extra_field(struct criterion_test_extra_data *data, size_t offset) {
  return (char *)data + offset;
}

/* Returns the fini of data (a test's or a suite's; NULL when it has none) and
 * clears it, so that Criterion's teardown does not run it a second time. */
static fixture_fn *take_fini(struct criterion_test_extra_data *data) {
  fixture_fn *fini = NULL, *none = NULL;
  if (!data) return NULL;
  void *at = extra_field(data, offsetof(struct criterion_test_extra_data, fini));
  memcpy(&fini, at, sizeof fini);
  memcpy(at, &none, sizeof none);
  return fini;
}

static int is_parameterized(void) {
  struct criterion_test_params (*params)(void) = NULL;
  memcpy(&params,
         extra_field(criterion_current_test->data,
                     offsetof(struct criterion_test_extra_data, param_)),
         sizeof params);
  return params != NULL;
}

/* LeakSanitizer scans the live part of each thread's stack conservatively.
 * A frame made after the body returned lies where the body's frames were,
 * and a slot of it that the frame never writes still holds what the body
 * left there: a pointer to a lost block hides the leak (it did, with a
 * dist_client never closed). So the body, the finis and the check are each
 * called from the one frame made before the body ran, with the stack below
 * it zeroed before each of the latter two. */
#define DEAD_STACK_BYTES (256 * 1024)

/* Not instrumented by ASan: its redzones would leave a part of this frame,
 * where the next frame will lie, unzeroed (they left a dist_client). */
__attribute__((noinline, no_sanitize_address)) static void zero_dead_stack(void) {
  volatile unsigned char dead[DEAD_STACK_BYTES];
  for (size_t i = 0; i < sizeof dead; i++) dead[i] = 0;
}

/* The teardown's work, done in the main phase after a body that returned. */
__attribute__((noinline)) static void run_finis(void) {
  fixture_fn *test_fini = take_fini(criterion_current_test->data);
  fixture_fn *suite_fini = take_fini(criterion_current_suite->data);
  if (test_fini) test_fini();
  if (suite_fini) suite_fini();
}

/* LeakSanitizer prints its report on stderr; the assertion fails the test. */
__attribute__((noinline)) static void check_leaks(void) {
  if (__lsan_do_recoverable_leak_check())
    cr_assert_fail("LeakSanitizer found memory this test leaked (its report is above)");
}

static void *test_param;
static int test_has_param;

__attribute__((noinline)) static void call_body(void) {
  if (test_has_param)
    ((param_test_fn *)test_body)(test_param);
  else
    test_body();
}

static void run_checked_test(void) {
  call_body();
  zero_dead_stack();
  run_finis();
  zero_dead_stack();
  check_leaks();
}

static void run_parameterized_test(void *param) {
  test_param = param;
  run_checked_test();
}

const char *__lsan_default_options(void) { return "leak_check_at_exit=0"; }

void __wrap_criterion_internal_test_main(void (*fn)(void));

void __wrap_criterion_internal_test_main(void (*fn)(void)) {
  test_body = fn;
  test_has_param = is_parameterized();
  if (test_has_param)
    __real_criterion_internal_test_main((void (*)(void))run_parameterized_test);
  else
    __real_criterion_internal_test_main(run_checked_test);
}
