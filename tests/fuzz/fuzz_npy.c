/* dist_npy_parse on arbitrary bytes: what a client's .npy file reaches. */
#include "fuzz_check.h"
#include "tensor.h"

static void parse_once(const uint8_t *data, size_t size, dist_dtype want) {
  dist_dtype dt = want;
  dist_shape shape;
  const void *payload = NULL;
  size_t nbytes = 0;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = dist_npy_parse(data, size, &dt, &shape, &payload, &nbytes, &eb);
  if (rc != 0) {
    fuzz_check_rejection(rc, &eb);
    return;
  }
  /* Accepted: the data is exactly the rest of the buffer, and the shape's
   * element count (computed the way every consumer computes it) times the
   * element size is its length. */
  FUZZ_CHECK(dist_dtype_size(dt) > 0);
  FUZZ_CHECK(dt != DIST_BFLOAT16 || want == DIST_BFLOAT16);
  FUZZ_CHECK(shape.ndim >= 0 && shape.ndim <= DIST_MAX_DIMS);
  for (int d = 0; d < shape.ndim; d++) FUZZ_CHECK(shape.dims[d] >= 0);
  int64_t numel = dist_shape_numel(&shape);
  FUZZ_CHECK(numel >= 0);
  FUZZ_CHECK((uint64_t)numel * dist_dtype_size(dt) == nbytes);
  FUZZ_CHECK((const uint8_t *)payload >= data);
  FUZZ_CHECK((const uint8_t *)payload + nbytes == data + size);
  fuzz_touch(payload, nbytes);
  char text[160];
  dist_shape_format(&shape, text, sizeof text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* Copy to an exact-size heap block, so ASan catches reads past the end. */
  uint8_t *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  memcpy(copy, data, size);
  /* '<u2' is bfloat16 only when asked for: try both ways. */
  parse_once(copy, size, DIST_DTYPE_INVALID);
  parse_once(copy, size, DIST_BFLOAT16);
  free(copy);
  return 0;
}
