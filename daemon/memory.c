/* The daemon's heap policy (memory.h). */
#include "memory.h"

#include <malloc.h>

#include "pbuf.h"

void distd_memory_policy_init(void) {
  /* One arena: a thread's own arena holds blocks of at most 64 MiB, and
   * glibc maps larger ones afresh whatever M_MMAP_MAX says. The daemon's
   * few threads allocate little outside large tensor blocks. */
  mallopt(M_ARENA_MAX, 1);
  dist_heap_keep(); /* big blocks from the heap, reused, no give-back at each free ... */
  /* Its blocks rarely fault, so the message blocks need not start on a
   * 2 MiB boundary for huge pages: placed so, a request's 2 MiB input made
   * W=2 all-to-all at 1 MiB per pair 10-13% slower daemon to daemon in
   * three series of 6-8 alternating launches (cause not found). */
  dist_pbuf_align_large(0);
}

/* ... but once per idle period (state kept for the one caller, the loop
 * thread's timer). */
int distd_memory_tick(int64_t now_ms, uint64_t calls_done, int busy) {
  static uint64_t seen_calls;
  static int64_t quiet_since_ms;
  static int trimmed;
  if (busy || calls_done != seen_calls || quiet_since_ms == 0) {
    seen_calls = calls_done;
    quiet_since_ms = now_ms;
    trimmed = 0;
    return 0;
  }
  if (trimmed || now_ms - quiet_since_ms < DISTD_MEMORY_IDLE_MS) return 0;
  malloc_trim(0);
  trimmed = 1;
  return 1;
}
