/* jansson whose k-th allocation fails (from 1; 0: none fails), for tests
 * that walk every k of a call that builds or reads JSON and check that each
 * either fails with DIST_ENOMEM or does its whole job (json_memory.h).
 * Header-only: each test that includes it gets its own counter. */
#ifndef TEST_JANSSON_FAILING_H
#define TEST_JANSSON_FAILING_H

#include <jansson.h>
#include <stdlib.h>

static long jansson_fail_at, jansson_allocations;

static void *jansson_counting_malloc(size_t n) {
  return ++jansson_allocations == jansson_fail_at ? NULL : malloc(n);
}

/* From now on jansson's k-th allocation fails. */
static void jansson_fail_from_now(long k) {
  jansson_fail_at = k;
  jansson_allocations = 0;
  json_set_alloc_funcs(jansson_counting_malloc, free);
}

/* Back to the plain allocator; the allocations counted since. */
static long jansson_restore(void) {
  json_set_alloc_funcs(malloc, free);
  return jansson_allocations;
}

#endif
