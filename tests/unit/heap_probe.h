/* What a heap policy does to large blocks, measured: page faults of a
 * reused block and resident memory (test_memory, test_client_heap). */
#ifndef DIST_TEST_HEAP_PROBE_H
#define DIST_TEST_HEAP_PROBE_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define BLOCK (48 * MIB) /* a W=4 reduce-scatter's received blocks at 16 MiB */

/* Keeps the compiler from dropping a malloc, memset, free sequence. */
static inline void touch(char *p, int byte) {
  memset(p, byte, BLOCK);
  __asm__ volatile("" : : "r"(p) : "memory");
}

static inline long minor_faults(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

/* Page faults taken while filling a fresh allocation of BLOCK bytes, after
 * one such block was allocated, filled and freed. */
static inline long faults_of_second_block(void) {
  char *a = malloc(BLOCK);
  cr_assert_not_null(a);
  touch(a, 1);
  free(a);
  long before = minor_faults();
  char *b = malloc(BLOCK);
  cr_assert_not_null(b);
  touch(b, 2);
  long faults = minor_faults() - before;
  free(b);
  return faults;
}

/* AddressSanitizer brings its own allocator, which glibc's policy does not
 * steer: the tests about glibc's behaviour do not apply there. */
#if defined(__SANITIZE_ADDRESS__)
#define GLIBC_MALLOC_ONLY() cr_skip_test("AddressSanitizer replaces glibc malloc")
#else
#define GLIBC_MALLOC_ONLY() ((void)0)
#endif

static inline long resident_bytes(void) {
  long pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  cr_assert_not_null(f);
  cr_assert_eq(fscanf(f, "%ld %ld", &pages, &resident), 2);
  fclose(f);
  return resident * sysconf(_SC_PAGESIZE);
}

#endif
