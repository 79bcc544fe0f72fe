/* FNV-1a, 64 bits: a small, stable hash for digests and keys that must
 * agree across processes (not for anything an attacker chooses). */
#ifndef DIST_HASH_H
#define DIST_HASH_H

#include <stddef.h>
#include <stdint.h>

uint64_t dist_fnv1a(const void *data, size_t n);

#endif
