/* Shared bits of the libFuzzer harnesses. A harness checks more than "no
 * crash": every rejection must come with its code in the errbuf and a
 * message, and every acceptance must satisfy the decoder's contract.
 * FUZZ_CHECK aborts (a finding for libFuzzer) when a property fails. */
#ifndef DIST_FUZZ_CHECK_H
#define DIST_FUZZ_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"

#define FUZZ_CHECK(cond)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__, __LINE__,  \
              #cond);                                                      \
      abort();                                                             \
    }                                                                      \
  } while (0)

/* A rejection names what is wrong: the code is recorded and there is a
 * NUL-terminated, non-empty message. */
static inline void fuzz_check_rejection(int rc, const dist_errbuf *eb) {
  FUZZ_CHECK(rc != 0);
  FUZZ_CHECK(eb->code == rc);
  FUZZ_CHECK(memchr(eb->msg, 0, sizeof eb->msg) != NULL);
  FUZZ_CHECK(eb->msg[0] != 0);
}

/* The input as a C string, for decoders of text. NULL when the input holds
 * a NUL byte: the file loaders refuse such files before parsing. */
static inline char *fuzz_text(const uint8_t *data, size_t size) {
  if (memchr(data, 0, size)) return NULL;
  char *s = malloc(size + 1);
  if (!s) return NULL;
  memcpy(s, data, size);
  s[size] = 0;
  return s;
}

/* Reads every byte of buf so ASan sees any out-of-bounds span. */
static inline void fuzz_touch(const void *buf, size_t n) {
  volatile uint8_t sink = 0;
  for (size_t i = 0; i < n; i++) sink ^= ((const uint8_t *)buf)[i];
  (void)sink;
}

#endif
