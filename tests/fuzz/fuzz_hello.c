/* dist_hello_decode on the 80-byte HELLO payload a connecting peer sends. */
#include "frame.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < DIST_HELLO_SIZE) return 0; /* the reader waits for all 80 */
  uint8_t in[DIST_HELLO_SIZE], again[DIST_HELLO_SIZE];
  memcpy(in, data, sizeof in);
  dist_hello h, back;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = dist_hello_decode(in, &h, &eb);
  /* Even when refused, the cluster id is a C string: callers print it. */
  FUZZ_CHECK(memchr(h.cluster_id, 0, sizeof h.cluster_id) != NULL);
  if (rc != 0) {
    fuzz_check_rejection(rc, &eb);
    return 0;
  }
  FUZZ_CHECK(h.world_size > 0);
  FUZZ_CHECK(strlen(h.cluster_id) < sizeof h.cluster_id);
  dist_hello_encode(&h, again);
  FUZZ_CHECK(dist_hello_decode(again, &back, &eb) == 0);
  FUZZ_CHECK(back.rank == h.rank && back.world_size == h.world_size &&
             back.boot_id == h.boot_id &&
             strcmp(back.cluster_id, h.cluster_id) == 0);
  return 0;
}
