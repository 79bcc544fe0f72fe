/* Scratch space that collectives reuse from one op to the next.
 *
 * Why: glibc serves an allocation above its largest mmap threshold (32 MiB)
 * with a fresh mmap, whose every page faults on first touch and is unmapped
 * again at free. A W=4 reduce-scatter of 16 MiB per pair needs 48 MiB of
 * temporary space per op: on these VMs, where a page fault is expensive,
 * that took the op from tens to hundreds of milliseconds. A few large
 * buffers are kept after use and handed out again; one unused for
 * DISTD_SCRATCH_IDLE_MS is given back to the system.
 *
 * Thread safe. Buffers below DISTD_SCRATCH_MIN go straight to malloc/free,
 * which reuses them well by itself. */
#ifndef DISTD_SCRATCH_H
#define DISTD_SCRATCH_H

#include <stddef.h>
#include <stdint.h>

#define DISTD_SCRATCH_MIN ((size_t)1 << 20)   /* smaller ones are not kept */
#define DISTD_SCRATCH_SLOTS 4                 /* buffers kept at most */
#define DISTD_SCRATCH_MAX ((size_t)1 << 30)   /* bytes kept at most */
#define DISTD_SCRATCH_IDLE_MS 10000

/* At least len bytes (64-byte aligned), or NULL when out of memory. */
void *distd_scratch_get(size_t len);
/* Gives buf (from distd_scratch_get, or NULL) back for reuse. */
void distd_scratch_put(void *buf);
/* Frees kept buffers unused since now_ms - idle_ms (0: all of them). */
void distd_scratch_trim(int64_t now_ms, int64_t idle_ms);
/* Bytes kept now (for tests and metrics). */
size_t distd_scratch_kept_bytes(void);

#endif
