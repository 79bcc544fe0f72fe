/* jansson whose allocations fail on demand, for tests that walk every k of
 * a call that builds or reads JSON and check that each either fails with
 * DIST_ENOMEM or does its whole job (json_memory.h). The failing allocator
 * is set once, before main, so that it stays innermost: libdist's watch
 * (json_memory.c) goes in front of it on its first use and sees each of
 * its NULLs, as it would the system's. Setting jansson's allocator again
 * later would take the watch away. Header-only: each test that includes it
 * gets its own counter. */
#ifndef TEST_JANSSON_FAILING_H
#define TEST_JANSSON_FAILING_H

#include <jansson.h>
#include <stdlib.h>

static long jansson_fail_at;       /* the k-th allocation fails; 0: none */
static long jansson_fail_from;     /* every allocation from the k-th fails; 0: none */
static size_t jansson_failing_size; /* every allocation of this size fails; 0: none */
static long jansson_allocations;

static void *jansson_failing_malloc(size_t n) {
  long k = ++jansson_allocations;
  int fail = k == jansson_fail_at || (jansson_fail_from && k >= jansson_fail_from) ||
             (jansson_failing_size && n == jansson_failing_size);
  return fail ? NULL : malloc(n);
}

__attribute__((constructor)) static void jansson_failing_install(void) {
  json_set_alloc_funcs(jansson_failing_malloc, free);
}

/* From now on jansson's k-th allocation fails. */
static inline void jansson_fail_from_now(long k) {
  jansson_fail_at = k;
  jansson_allocations = 0;
}

/* From now on every allocation of jansson's from the k-th fails. */
static inline void jansson_fail_all_from(long k) {
  jansson_fail_from = k;
  jansson_allocations = 0;
}

/* From now on every allocation of n bytes fails (an allocator that cannot
 * serve a size class). */
static inline void jansson_fail_size(size_t n) {
  jansson_failing_size = n;
  jansson_allocations = 0;
}

/* Nothing fails any more; the allocations counted since the last call
 * above. */
static inline long jansson_restore(void) {
  jansson_fail_at = jansson_fail_from = 0;
  jansson_failing_size = 0;
  return jansson_allocations;
}

#endif
