/* The files a checkpoint's manifest names (daemon/checkpoint.c), read as a
 * commit does before it removes the files no manifest names: a manifest
 * that cannot be read for want of memory must not read as one naming
 * none, or the commit would remove every file. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "jansson_failing.h"

static char dir[] = "/tmp/test_ckpt_manifest_XXXXXX";

static void write_manifest(void) {
  cr_assert_not_null(mkdtemp(dir));
  dist_errbuf eb = DIST_ERRBUF_INIT;
  const char *text = "{\"files\": [{\"file\": \"a.0.safetensors\"}, {\"file\": \"a.1.safetensors\"}]}";
  cr_assert_eq(distd_ckpt_write_manifest(dir, text, &eb), 0, "%s", dist_errbuf_msg(&eb));
}

static void remove_manifest(void) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", dir, DISTD_CKPT_MANIFEST);
  unlink(path);
  rmdir(dir);
}

TestSuite(ckpt_manifest, .init = write_manifest, .fini = remove_manifest);

Test(ckpt_manifest, names_the_files_it_lists) {
  char **files = NULL;
  size_t n = 0;
  cr_assert_eq(distd_ckpt_manifest_files(dir, &files, &n), 2);
  cr_assert_eq(n, 2);
  cr_assert_str_eq(files[0], "a.0.safetensors");
  cr_assert_str_eq(files[1], "a.1.safetensors");
  distd_ckpt_files_free(files, n);
}

Test(ckpt_manifest, a_manifest_jansson_cannot_allocate_for_is_an_error_not_an_empty_list) {
  char **files = NULL;
  size_t n = 7;
  jansson_fail_all_from(1);
  int rc = distd_ckpt_manifest_files(dir, &files, &n);
  jansson_restore();
  cr_assert_eq(rc, -1, "read as %d files", rc);
  cr_assert_null(files);
  cr_assert_eq(n, 0);
}

Test(ckpt_manifest, a_manifest_that_is_not_json_names_no_file) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_ckpt_write_manifest(dir, "{\"files\": [", &eb), 0, "%s",
               dist_errbuf_msg(&eb));
  char **files = NULL;
  size_t n = 7;
  cr_assert_eq(distd_ckpt_manifest_files(dir, &files, &n), 0);
  cr_assert_eq(n, 0);
  distd_ckpt_files_free(files, n);
}
