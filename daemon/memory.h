/* How the daemon's heap behaves (glibc malloc), and when it gives memory
 * back to the system.
 *
 * Why: by default glibc serves an allocation above its mmap threshold (128
 * KiB, rising to at most 32 MiB) with a fresh mmap, and gives freed memory
 * back at once. Every page of a fresh mapping faults on first touch, and a
 * page fault is expensive on these VMs: a W=4 reduce-scatter of 16 MiB per
 * pair, whose 48 MiB of received blocks were a fresh mapping each op, took
 * ~0.5 s per op instead of ~30 ms, and a trainer's 1 MiB all-to-all spent
 * most of its 40 ms in the request and reply buffers' faults. So the daemon
 * keeps freed memory for its next operation, and gives it back once it
 * has been idle (no RPC) for DISTD_MEMORY_IDLE_MS: short, because a
 * daemon at rest should hold little more than its tensors (the memory
 * target of ../shared/docs/performance.md), and long enough to span the
 * gaps between the operations of a burst. */
#ifndef DISTD_MEMORY_H
#define DISTD_MEMORY_H

#include <stdint.h>

#define DISTD_MEMORY_IDLE_MS 2000

/* Sets the policy; call first thing in main, before any thread starts. */
void distd_memory_policy_init(void);

/* Called periodically with the number of RPCs handled so far and whether
 * one is in progress: gives freed memory back (malloc_trim) once per idle
 * period, when nothing ran for DISTD_MEMORY_IDLE_MS. Returns 1 when it
 * trimmed. */
int distd_memory_tick(int64_t now_ms, uint64_t calls_done, int busy);

#endif
