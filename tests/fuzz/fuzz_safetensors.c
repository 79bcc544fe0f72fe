/* dist_st_parse on arbitrary bytes: what a checkpoint file on disk reaches
 * (a file may be truncated, corrupted or planted). */
#include "fuzz_check.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* Copy to an exact-size heap block, so ASan catches reads past the end. */
  uint8_t *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  memcpy(copy, data, size);
  dist_st_file *f = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int rc = dist_st_parse(copy, size, &f, &eb);
  if (rc != 0) {
    fuzz_check_rejection(rc, &eb);
  } else {
    /* Accepted: every entry lies inside the buffer, its size is its shape's
     * element count times the element size, and it can be found by name. */
    FUZZ_CHECK(f->count >= 0);
    for (int i = 0; i < f->count; i++) {
      const dist_st_entry *e = &f->entries[i];
      FUZZ_CHECK(dist_dtype_size(e->dtype) > 0);
      FUZZ_CHECK(e->shape.ndim >= 0 && e->shape.ndim <= DIST_MAX_DIMS);
      FUZZ_CHECK((uint64_t)dist_shape_numel(&e->shape) * dist_dtype_size(e->dtype) ==
                 e->nbytes);
      FUZZ_CHECK((const uint8_t *)e->data >= copy);
      FUZZ_CHECK((const uint8_t *)e->data + e->nbytes <= copy + size);
      FUZZ_CHECK(dist_st_find(f, e->name) != NULL);
      fuzz_touch(e->data, e->nbytes);
    }
    for (int i = 0; i < f->nmeta; i++) FUZZ_CHECK(dist_st_meta(f, f->meta_keys[i]));
  }
  dist_st_free(f);
  free(copy);
  return 0;
}
