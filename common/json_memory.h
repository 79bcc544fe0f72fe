/* jansson and running out of memory. jansson answers NULL (or -1 from a set
 * or an append) both for input it refuses and for an allocation of its own
 * that failed; a caller that reads every NULL as bad input calls a valid
 * manifest invalid, and one that ignores a failed append writes a document
 * with an entry missing. Builders here check each step, and a failed load
 * is told apart with this. */
#ifndef DIST_JSON_MEMORY_H
#define DIST_JSON_MEMORY_H

#include <jansson.h>

/* json_dumps, except that it answers NULL whenever an allocation failed.
 * jansson 2.14's own json_dumps can answer a document with a key's closing
 * quote left out when its buffer cannot grow (do_dump ignores the key's
 * write: akheron/jansson#655). Free the text with free(). */
char *dist_json_dumps(const json_t *json, size_t flags);

/* json_loadb, made safe for want of memory: *no_memory is set to 1 when
 * any allocation jansson made for the load failed, and then NULL comes
 * back, never a document read wrong. jansson 2.14's lexer drops a
 * character when its buffer cannot grow and goes on ("a.0.safetensors"
 * read as "a.0.safetensor"), and it reports other failed allocations as
 * syntax errors or not at all, so its answer cannot tell. The failures are
 * counted, per thread, by an allocator put once in front of the one
 * jansson has at the first call (a program that sets jansson's allocator
 * must do so before, as jansson's docs ask of any use; one that wraps it
 * later keeps the watch). err may be NULL.
 * Not guarded against: when jansson's buffer keeps failing to grow for the
 * rest of a token, its lexer copies a string past the buffer or stops on
 * an assert in a number (akheron/jansson#362, open; the fix proposed in
 * its PR #747 is not released): a heap overflow or an abort inside
 * jansson, which allocations that keep failing reach, not one alone. */
json_t *dist_json_loadb(const char *buf, size_t len, size_t flags, json_error_t *err,
                        int *no_memory);

/* json_unpack, telling a value that does not match fmt (1) from jansson
 * failing to allocate (-1: its unpack of an object keeps the keys it saw
 * in a table it allocates, and a failure there read as a mismatch); 0
 * when it matched. Failures are counted as dist_json_loadb's are. */
int dist_json_unpack(json_t *root, const char *fmt, ...);

#endif
