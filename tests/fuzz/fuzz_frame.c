/* dist_frame_decode on the 40 header bytes a peer sends first. */
#include "frame.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < DIST_FRAME_HEADER_SIZE) return 0; /* the reader waits for 40 */
  uint8_t in[DIST_FRAME_HEADER_SIZE], again[DIST_FRAME_HEADER_SIZE];
  memcpy(in, data, sizeof in);
  dist_frame_header h;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = dist_frame_decode(in, &h, &eb);
  if (rc != 0) {
    fuzz_check_rejection(rc, &eb);
    return 0;
  }
  FUZZ_CHECK(h.magic == DIST_FRAME_MAGIC);
  FUZZ_CHECK(h.version == DIST_FRAME_VERSION);
  FUZZ_CHECK(h.kind >= DIST_FRAME_HELLO && h.kind <= DIST_FRAME_KIND_LAST);
  /* Every header field is kept: encoding gives back the same bytes. */
  dist_frame_encode(&h, again);
  FUZZ_CHECK(memcmp(in, again, sizeof in) == 0);
  return 0;
}
