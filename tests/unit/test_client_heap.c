/* The trainer's heap under libdist (dist.h, "Memory"): from the first
 * client on, a large block freed by one call is reused by the next without
 * page faults; the last dist_close gives the kept memory back;
 * DIST_KEEP_HEAP=0 leaves glibc's default. Each test runs in its own
 * process (criterion), so each sees libdist's first client. No daemon is
 * needed: a client connects lazily. */
#include <criterion/criterion.h>

#include "dist/dist.h"
#include "heap_probe.h"

static dist_client *lazy_client(void) {
  dist_client *c = NULL;
  cr_assert_eq(dist_connect("127.0.0.1:1", NULL, &c), 0);
  return c;
}

Test(client_heap, a_client_keeps_large_blocks_for_reuse_until_the_last_close) {
  GLIBC_MALLOC_ONLY();
  unsetenv("DIST_KEEP_HEAP");
  dist_client *a = lazy_client(), *b = lazy_client();
  long faults = faults_of_second_block();
  cr_assert_lt(faults, 100, "%ld faults for a reused %zu MiB block", faults, BLOCK / MIB);
  long kept = resident_bytes();
  dist_close(a);
  cr_assert_gt(resident_bytes(), kept - (long)MIB, "given back while a client is open");
  dist_close(b);
  long after = resident_bytes();
  cr_assert_lt(after, kept - (long)(BLOCK / 2), "resident %ld -> %ld bytes", kept, after);
}

Test(client_heap, dist_keep_heap_0_leaves_malloc_as_it_is) {
  GLIBC_MALLOC_ONLY();
  setenv("DIST_KEEP_HEAP", "0", 1);
  dist_client *c = lazy_client();
  long faults = faults_of_second_block();
  cr_assert_gt(faults, 100, "%ld faults: the block was kept", faults);
  char *p = malloc(BLOCK);
  cr_assert_not_null(p);
  touch(p, 3);
  free(p);
  cr_assert_lt(resident_bytes(), (long)BLOCK, "a freed block stayed resident");
  dist_close(c);
}
