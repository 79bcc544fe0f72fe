/* Reusable scratch buffers (scratch.h). Each buffer carries its capacity
 * in a header before the bytes handed out. */
#include "scratch.h"

#include <pthread.h>
#include <stdlib.h>

#include "clock.h"

#define HEADER 64 /* keeps the bytes handed out 64-byte aligned */

typedef struct kept {
  void *base; /* NULL: free slot */
  size_t cap;
  int64_t since_ms;
} kept;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static kept slots[DISTD_SCRATCH_SLOTS];
static size_t kept_bytes;

static size_t *cap_of(void *base) { return (size_t *)base; }

void *distd_scratch_get(size_t len) {
  if (len >= DISTD_SCRATCH_MIN) {
    int best = -1;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < DISTD_SCRATCH_SLOTS; i++)
      if (slots[i].base && slots[i].cap >= len && (best < 0 || slots[i].cap < slots[best].cap))
        best = i;
    void *base = best >= 0 ? slots[best].base : NULL;
    if (base) {
      kept_bytes -= slots[best].cap;
      slots[best].base = NULL;
    }
    pthread_mutex_unlock(&mu);
    if (base) return (char *)base + HEADER;
  }
  void *base = NULL;
  if (posix_memalign(&base, HEADER, HEADER + (len ? len : 1)) != 0) return NULL;
  *cap_of(base) = len;
  return (char *)base + HEADER;
}

/* The slot to keep a buffer of cap bytes in: a free one, else the smallest
 * kept buffer if smaller than cap (evicted into *evict); -1 if none. */
static int slot_for(size_t cap, void **evict) {
  int smallest = -1;
  for (int i = 0; i < DISTD_SCRATCH_SLOTS; i++) {
    if (!slots[i].base) return i;
    if (smallest < 0 || slots[i].cap < slots[smallest].cap) smallest = i;
  }
  if (slots[smallest].cap >= cap) return -1;
  *evict = slots[smallest].base;
  kept_bytes -= slots[smallest].cap;
  slots[smallest].base = NULL;
  return smallest;
}

void distd_scratch_put(void *buf) {
  if (!buf) return;
  void *base = (char *)buf - HEADER, *evict = NULL;
  size_t cap = *cap_of(base);
  int i = -1;
  pthread_mutex_lock(&mu);
  if (cap >= DISTD_SCRATCH_MIN && cap <= DISTD_SCRATCH_MAX - kept_bytes)
    i = slot_for(cap, &evict);
  if (i >= 0) {
    slots[i] = (kept){base, cap, distd_now_ms()};
    kept_bytes += cap;
  }
  pthread_mutex_unlock(&mu);
  free(evict);
  if (i < 0) free(base);
}

void distd_scratch_trim(int64_t now_ms, int64_t idle_ms) {
  void *drop[DISTD_SCRATCH_SLOTS];
  int n = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < DISTD_SCRATCH_SLOTS; i++) {
    if (!slots[i].base || (idle_ms > 0 && now_ms - slots[i].since_ms < idle_ms)) continue;
    drop[n++] = slots[i].base;
    kept_bytes -= slots[i].cap;
    slots[i].base = NULL;
  }
  pthread_mutex_unlock(&mu);
  for (int i = 0; i < n; i++) free(drop[i]); /* outside mu: munmap is slow */
}

size_t distd_scratch_kept_bytes(void) {
  pthread_mutex_lock(&mu);
  size_t n = kept_bytes;
  pthread_mutex_unlock(&mu);
  return n;
}
