#include "hash.h"

uint64_t dist_fnv1a(const void *data, size_t n) {
  const unsigned char *b = data;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
