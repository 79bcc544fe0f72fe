/* dist_abort_range_decode on the payload of an ABORT_RANGE frame (kind 9)
 * a peer sends: the count of ids, then the reason. */
#include "frame.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* The reader NUL-terminates the payload past its end (peer_control.c);
   * the decoder itself bounds its length. */
  uint8_t *in = malloc(size + 1);
  if (!in) return 0;
  memcpy(in, data, size);
  in[size] = 0;
  dist_abort_range a;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = dist_abort_range_decode(in, size, &a, &eb);
  if (rc != 0) {
    fuzz_check_rejection(rc, &eb);
    FUZZ_CHECK(rc == DIST_EPROTO);
    free(in);
    return 0;
  }
  FUZZ_CHECK(size >= DIST_ABORT_RANGE_COUNT_SIZE && size <= DIST_ABORT_RANGE_MAX);
  FUZZ_CHECK(a.count >= 1 && a.count <= DIST_ABORT_RANGE_COUNT_MAX);
  /* The reason is the rest of the payload, whole, as a C string. */
  FUZZ_CHECK(a.reason == (const char *)in + DIST_ABORT_RANGE_COUNT_SIZE);
  FUZZ_CHECK(strlen(a.reason) == size - DIST_ABORT_RANGE_COUNT_SIZE);
  /* Every byte is kept: encoding gives back the same payload. */
  uint8_t again[DIST_ABORT_RANGE_MAX];
  FUZZ_CHECK(dist_abort_range_encode(&a, again) == size);
  FUZZ_CHECK(memcmp(in, again, size) == 0);
  free(in);
  return 0;
}
