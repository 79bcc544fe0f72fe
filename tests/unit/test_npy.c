/* The .npy reader and writer: round trips for every dtype, interchange with
 * numpy itself (/usr/bin/python3 must have numpy: a missing numpy fails these
 * tests, it does not skip them), and malformed input that must be rejected
 * without reading out of bounds (run under ASan). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tensor.h"

extern char **environ;

/* ---- helpers ----------------------------------------------------------- */

static char tmp_dir[256];

static void make_tmp_dir(void) {
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(tmp_dir, sizeof tmp_dir, "%s/test_npy.XXXXXX", base);
  cr_assert_not_null(mkdtemp(tmp_dir), "mkdtemp failed");
}

static void remove_tmp_dir(void) {
  DIR *d = opendir(tmp_dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmp_dir, e->d_name);
    unlink(p);
  }
  closedir(d);
  rmdir(tmp_dir);
}

static const char *tmp_path(const char *name) {
  static char p[512];
  snprintf(p, sizeof p, "%s/%s", tmp_dir, name);
  return p;
}

/* Runs /usr/bin/python3 -c script tmp_dir with a 60 s deadline; returns the
 * exit status (or -1). */
static int run_python(const char *script) {
  char *argv[] = {"/usr/bin/python3", "-c", (char *)script, tmp_dir, NULL};
  pid_t pid;
  if (posix_spawn(&pid, argv[0], NULL, NULL, argv, environ) != 0) return -1;
  struct timespec nap = {0, 10 * 1000 * 1000};
  for (int waited = 0; waited < 6000; waited++) {
    int status;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (r < 0) return -1;
    nanosleep(&nap, NULL);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

static void require_numpy(void) {
  int rc = run_python("import numpy");
  cr_assert_eq(rc, 0,
               "/usr/bin/python3 with numpy is required by these tests (Debian: python3-numpy); "
               "exit status %d",
               rc);
}

static const dist_dtype numpy_dtypes[] = {DIST_BOOL,    DIST_INT8,    DIST_UINT8,
                                          DIST_INT32,   DIST_INT64,   DIST_FLOAT16,
                                          DIST_FLOAT32, DIST_FLOAT64};
#define NNUMPY (sizeof numpy_dtypes / sizeof numpy_dtypes[0])

/* The value both sides put at element i: exact in every dtype. */
static double value_at(dist_dtype dt, size_t i) {
  if (dt == DIST_BOOL) return i % 3 == 0;
  if (dt == DIST_UINT8) return (double)(i % 200);
  return (double)(i % 100) - 50 + (dist_dtype_is_float(dt) ? 0.25 : 0);
}

/* ---- round trips ------------------------------------------------------- */

TestSuite(npy, .init = make_tmp_dir, .fini = remove_tmp_dir);

static void round_trip(dist_dtype dt, const dist_shape *shape) {
  size_t n = (size_t)dist_shape_numel(shape), sz = dist_dtype_size(dt);
  char *data = malloc(n * sz + 1);
  for (size_t i = 0; i < n; i++) dist_elem_set(data, dt, i, value_at(dt, i));
  dist_errbuf eb = DIST_ERRBUF_INIT;
  const char *path = tmp_path("rt.npy");
  cr_assert_eq(dist_npy_write(path, dt, shape, data, &eb), 0, "%s", eb.msg);
  dist_dtype got = dt == DIST_BFLOAT16 ? DIST_BFLOAT16 : DIST_DTYPE_INVALID;
  dist_shape gs;
  void *back = NULL;
  size_t nbytes = 0;
  cr_assert_eq(dist_npy_read(path, &got, &gs, &back, &nbytes, &eb), 0, "%s: %s",
               dist_dtype_name(dt), eb.msg);
  cr_expect_eq(got, dt);
  cr_expect(dist_shape_equal(&gs, shape), "%s", dist_dtype_name(dt));
  cr_expect_eq(nbytes, n * sz);
  cr_expect_arr_eq(back, data, n * sz, "%s", dist_dtype_name(dt));
  free(back);
  free(data);
}

Test(npy, round_trip_every_dtype) {
  dist_dtype all[] = {DIST_BOOL,     DIST_INT8,    DIST_UINT8,  DIST_INT32, DIST_INT64,
                      DIST_FLOAT16, DIST_BFLOAT16, DIST_FLOAT32, DIST_FLOAT64};
  dist_shape shape = {3, {2, 3, 4}};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) round_trip(all[i], &shape);
}

Test(npy, round_trip_scalar_vector_empty_and_8d) {
  dist_shape scalar = {0, {0}}, vec = {1, {5}}, empty = {2, {0, 3}},
             eight = {8, {2, 1, 2, 1, 2, 1, 2, 3}};
  round_trip(DIST_FLOAT32, &scalar);
  round_trip(DIST_INT64, &vec);
  round_trip(DIST_FLOAT64, &empty);
  round_trip(DIST_INT32, &eight);
}

Test(npy, bfloat16_is_u2_and_needs_asking) {
  uint16_t v[2] = {0x3F80, 0xC000};
  dist_shape shape = {1, {2}};
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_npy_write(tmp_path("b.npy"), DIST_BFLOAT16, &shape, v, &eb), 0);
  dist_dtype dt = DIST_DTYPE_INVALID;
  dist_shape s;
  void *data = NULL;
  size_t nbytes;
  cr_expect_eq(dist_npy_read(tmp_path("b.npy"), &dt, &s, &data, &nbytes, &eb), DIST_ENOTSUP);
  cr_expect(strstr(eb.msg, "<u2") != NULL, "%s", eb.msg);
  cr_expect_null(data);
}

Test(npy, header_is_padded_to_64_bytes) {
  dist_shape shape = {2, {3, 1}};
  float v[3] = {1, 2, 3};
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_npy_write(tmp_path("h.npy"), DIST_FLOAT32, &shape, v, &eb), 0);
  FILE *f = fopen(tmp_path("h.npy"), "rb");
  unsigned char buf[256];
  size_t len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  /* The dict is 60 bytes, so with the 10-byte preamble and '\n' the header
   * rounds up to 128, as numpy's own header for this array does. */
  cr_assert_eq(len, 128 + 12);
  cr_expect_eq(buf[6], 1);
  cr_expect_eq(buf[7], 0);
  cr_expect_eq(buf[8] | buf[9] << 8, 128 - 10);
  cr_expect_eq(buf[127], '\n');
  cr_expect_eq(buf[126], ' ');
  cr_expect(memmem(buf, 128, "'descr': '<f4'", 14) != NULL);
  cr_expect(memmem(buf, 128, "'shape': (3, 1)", 15) != NULL);
}

Test(npy, missing_file_is_not_found) {
  dist_dtype dt = DIST_DTYPE_INVALID;
  dist_shape s;
  void *data;
  size_t n;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_expect_eq(dist_npy_read(tmp_path("nope.npy"), &dt, &s, &data, &n, &eb), DIST_ENOTFOUND);
  cr_expect(strstr(eb.msg, "nope.npy") != NULL);
}

/* ---- interchange with numpy -------------------------------------------- */

static const char *numpy_descr(dist_dtype dt) {
  switch (dt) {
    case DIST_BOOL: return "bool";
    case DIST_INT8: return "int8";
    case DIST_UINT8: return "uint8";
    case DIST_INT32: return "int32";
    case DIST_INT64: return "int64";
    case DIST_FLOAT16: return "float16";
    case DIST_FLOAT32: return "float32";
    case DIST_FLOAT64: return "float64";
    default: return "?";
  }
}

/* Python expression for value_at over a flat index array i. */
static const char *numpy_values(dist_dtype dt) {
  if (dt == DIST_BOOL) return "(i % 3 == 0)";
  if (dt == DIST_UINT8) return "(i % 200)";
  if (dist_dtype_is_float(dt)) return "(i % 100 - 50 + 0.25)";
  return "(i % 100 - 50)";
}

static void check_file(const char *name, dist_dtype want_dt, const dist_shape *want_shape) {
  dist_dtype dt = DIST_DTYPE_INVALID;
  dist_shape s;
  void *data = NULL;
  size_t nbytes;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_npy_read(tmp_path(name), &dt, &s, &data, &nbytes, &eb), 0, "%s: %s", name,
               eb.msg);
  cr_expect_eq(dt, want_dt, "%s", name);
  cr_expect(dist_shape_equal(&s, want_shape), "%s shape", name);
  for (size_t i = 0; i < (size_t)dist_shape_numel(&s); i++)
    cr_assert_eq(dist_elem_get(data, dt, i), value_at(dt, i), "%s elem %zu", name, i);
  free(data);
}

Test(npy, reads_files_numpy_wrote) {
  require_numpy();
  char script[4096];
  size_t pos = (size_t)snprintf(script, sizeof script,
                                "import numpy as np, sys\nd = sys.argv[1]\ni = np.arange(24)\n");
  for (size_t t = 0; t < NNUMPY; t++)
    pos += (size_t)snprintf(script + pos, sizeof script - pos,
                            "np.save(d + '/%s.npy', %s.astype('%s').reshape(2, 3, 4))\n",
                            numpy_descr(numpy_dtypes[t]), numpy_values(numpy_dtypes[t]),
                            numpy_descr(numpy_dtypes[t]));
  snprintf(script + pos, sizeof script - pos,
           "np.save(d + '/scalar.npy', np.float64(-49.75))\n"
           "np.save(d + '/vec.npy', (i[:7] %% 100 - 50).astype('int64'))\n"
           "np.save(d + '/empty.npy', np.zeros((0, 5), dtype='float32'))\n"
           "with open(d + '/v2.npy', 'wb') as f:\n"
           "    np.lib.format.write_array(f, (i %% 100 - 50 + 0.25).astype('float32').reshape(4, 6),"
           " version=(2, 0))\n");
  cr_assert_eq(run_python(script), 0, "python script failed");
  dist_shape s234 = {3, {2, 3, 4}};
  for (size_t t = 0; t < NNUMPY; t++) {
    char name[32];
    snprintf(name, sizeof name, "%s.npy", numpy_descr(numpy_dtypes[t]));
    check_file(name, numpy_dtypes[t], &s234);
  }
  dist_shape scalar = {0, {0}}, vec = {1, {7}}, empty = {2, {0, 5}}, s46 = {2, {4, 6}};
  check_file("scalar.npy", DIST_FLOAT64, &scalar);
  check_file("vec.npy", DIST_INT64, &vec);
  check_file("empty.npy", DIST_FLOAT32, &empty);
  check_file("v2.npy", DIST_FLOAT32, &s46);
}

Test(npy, numpy_reads_files_we_wrote) {
  require_numpy();
  dist_shape shape = {3, {2, 3, 4}};
  char script[4096];
  size_t pos = (size_t)snprintf(script, sizeof script,
                                "import numpy as np, sys\nd = sys.argv[1]\ni = np.arange(24)\n");
  for (size_t t = 0; t < NNUMPY; t++) {
    dist_dtype dt = numpy_dtypes[t];
    char data[24 * 8], name[32];
    for (size_t i = 0; i < 24; i++) dist_elem_set(data, dt, i, value_at(dt, i));
    snprintf(name, sizeof name, "ours_%s.npy", numpy_descr(dt));
    dist_errbuf eb = DIST_ERRBUF_INIT;
    cr_assert_eq(dist_npy_write(tmp_path(name), dt, &shape, data, &eb), 0, "%s", eb.msg);
    pos += (size_t)snprintf(script + pos, sizeof script - pos,
                            "a = np.load(d + '/%s')\n"
                            "assert a.dtype == np.dtype('%s'), a.dtype\n"
                            "assert a.shape == (2, 3, 4), a.shape\n"
                            "assert (a == %s.astype('%s').reshape(2, 3, 4)).all(), a\n",
                            name, numpy_descr(dt), numpy_values(dt), numpy_descr(dt));
  }
  cr_assert_eq(run_python(script), 0, "numpy rejected or misread a file we wrote");
}

Test(npy, rejects_what_numpy_can_write_but_we_do_not_support) {
  require_numpy();
  cr_assert_eq(run_python("import numpy as np, sys\nd = sys.argv[1]\n"
                          "np.save(d + '/fortran.npy', np.asfortranarray(np.ones((2, 3), 'float32')))\n"
                          "np.save(d + '/big.npy', np.ones(3, '>f4'))\n"
                          "np.save(d + '/complex.npy', np.ones(3, 'complex64'))\n"
                          "np.save(d + '/u2.npy', np.ones(3, 'uint16'))\n"
                          "np.save(d + '/nine.npy', np.ones((1,) * 9, 'float32'))\n"),
               0);
  static const struct {
    const char *file, *needle;
  } cases[] = {{"fortran.npy", "fortran_order"},
               {"big.npy", "big-endian"},
               {"complex.npy", "<c8"},
               {"u2.npy", "<u2"},
               {"nine.npy", "8 dims"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    dist_dtype dt = DIST_DTYPE_INVALID;
    dist_shape s;
    void *data = NULL;
    size_t n;
    dist_errbuf eb = DIST_ERRBUF_INIT;
    cr_expect_eq(dist_npy_read(tmp_path(cases[i].file), &dt, &s, &data, &n, &eb), DIST_ENOTSUP,
                 "%s: %s", cases[i].file, eb.msg);
    cr_expect(strstr(eb.msg, cases[i].needle) != NULL, "%s: message '%s'", cases[i].file, eb.msg);
    cr_expect(strstr(eb.msg, cases[i].file) != NULL, "message names the file: '%s'", eb.msg);
  }
}

/* ---- malformed input --------------------------------------------------- */

/* A .npy image with the given header dict (padded as numpy pads it) followed
 * by data_len bytes of 0x5a. The caller frees it. */
static unsigned char *build(const char *dict, int major, size_t data_len, size_t *len) {
  size_t pre = major == 1 ? 10 : 12, dl = strlen(dict);
  size_t total = ((pre + dl + 1 + 63) / 64) * 64;
  unsigned char *b = malloc(total + data_len);
  memcpy(b, "\x93NUMPY", 6);
  b[6] = (unsigned char)major;
  b[7] = 0;
  size_t hlen = total - pre;
  for (size_t i = 0; i < pre - 8; i++) b[8 + i] = (unsigned char)(hlen >> (8 * i));
  memcpy(b + pre, dict, dl);
  memset(b + pre + dl, ' ', total - pre - dl - 1);
  b[total - 1] = '\n';
  memset(b + total, 0x5a, data_len);
  *len = total + data_len;
  return b;
}

static int parse_dict(const char *dict, size_t data_len, dist_errbuf *eb) {
  size_t len;
  unsigned char *b = build(dict, 1, data_len, &len);
  dist_dtype dt = DIST_DTYPE_INVALID;
  dist_shape s;
  const void *data;
  size_t n;
  int rc = dist_npy_parse(b, len, &dt, &s, &data, &n, eb);
  free(b);
  return rc;
}

#define F4_23 "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"

Test(npy_parse, well_formed_v1_and_v2) {
  size_t len;
  unsigned char *b = build(F4_23, 2, 24, &len);
  dist_dtype dt = DIST_DTYPE_INVALID;
  dist_shape s;
  const void *data;
  size_t n;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_npy_parse(b, len, &dt, &s, &data, &n, &eb), 0, "%s", eb.msg);
  cr_expect_eq(dt, DIST_FLOAT32);
  cr_expect_eq(s.ndim, 2);
  cr_expect_eq(s.dims[0], 2);
  cr_expect_eq(s.dims[1], 3);
  cr_expect_eq(n, 24);
  cr_expect_eq((const unsigned char *)data, b + 128);
  free(b);
  /* Key order, quoting and spacing vary between writers. */
  cr_expect_eq(parse_dict("{\"shape\":(6,),\"fortran_order\":False,\"descr\":\"<i4\"}", 24, &eb), 0,
               "%s", eb.msg);
  cr_expect_eq(parse_dict("{'descr': '|u1', 'fortran_order': False, 'shape': (2L, 3L)}", 6, &eb), 0,
               "%s", eb.msg);
}

Test(npy_parse, errors_have_expected_codes_and_messages) {
  static const struct {
    const char *dict;
    size_t data_len;
    int code;
    const char *needle;
  } cases[] = {
      {F4_23, 23, DIST_EINVAL, "truncated data"},
      {F4_23, 25, DIST_EMISMATCH, "size mismatch"},
      {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24, DIST_ENOTSUP, "fortran_order"},
      {"{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", 24, DIST_ENOTSUP, "big-endian"},
      {"{'descr': '<c8', 'fortran_order': False, 'shape': (2, 3), }", 48, DIST_ENOTSUP, "'<c8'"},
      {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8, DIST_ENOTSUP, "structured"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4, DIST_ENOTSUP, "8 dims"},
      {"{'descr': '<f4', 'fortran_order': False, }", 4, DIST_EINVAL, "missing key 'shape'"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4, DIST_EINVAL, "repeated"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", 24, DIST_EINVAL, "shape"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", 8, DIST_EINVAL, "non-negative"},
      {"{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,), }", 8, DIST_EINVAL, "True or False"},
      {"{'descr': '<f4, 'fortran_order': False, 'shape': (2,), }", 8, DIST_EINVAL, "header"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,) 'x': 1}", 8, DIST_EINVAL, "expected ','"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } junk", 8, DIST_EINVAL, "trailing"},
      {"{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 4), }", 8, DIST_EINVAL,
       "overflow"},
      {"[1, 2]", 8, DIST_EINVAL, "expected '{'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    dist_errbuf eb = DIST_ERRBUF_INIT;
    int rc = parse_dict(cases[i].dict, cases[i].data_len, &eb);
    cr_expect_eq(rc, cases[i].code, "case %zu (%s): rc %d, message '%s'", i, cases[i].dict, rc, eb.msg);
    cr_expect(strstr(eb.msg, cases[i].needle) != NULL, "case %zu: message '%s' lacks '%s'", i, eb.msg,
              cases[i].needle);
  }
}

Test(npy_parse, bad_magic_version_and_header_length) {
  size_t len;
  unsigned char *b = build(F4_23, 1, 24, &len);
  dist_dtype dt = DIST_DTYPE_INVALID;
  dist_shape s;
  const void *data;
  size_t n;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  b[1] = 'X';
  cr_expect_eq(dist_npy_parse(b, len, &dt, &s, &data, &n, &eb), DIST_EINVAL);
  cr_expect(strstr(eb.msg, "magic") != NULL);
  b[1] = 'N';
  b[6] = 3;
  cr_expect_eq(dist_npy_parse(b, len, &dt, &s, &data, &n, &eb), DIST_ENOTSUP);
  cr_expect(strstr(eb.msg, "version 3.0") != NULL, "%s", eb.msg);
  b[6] = 1;
  b[9] = 0x7f; /* header length far past the end */
  cr_expect_eq(dist_npy_parse(b, len, &dt, &s, &data, &n, &eb), DIST_EINVAL);
  cr_expect(strstr(eb.msg, "truncated header") != NULL, "%s", eb.msg);
  free(b);
}

/* Every strict prefix of a valid file fails, reading only what it was given
 * (each prefix is its own heap block, so ASan catches any over-read). */
Test(npy_parse, every_truncation_fails_in_bounds) {
  size_t len;
  unsigned char *full = build(F4_23, 1, 24, &len);
  for (size_t cut = 0; cut < len; cut++) {
    unsigned char *b = malloc(cut ? cut : 1);
    memcpy(b, full, cut);
    dist_dtype dt = DIST_DTYPE_INVALID;
    dist_shape s;
    const void *data;
    size_t n;
    dist_errbuf eb = DIST_ERRBUF_INIT;
    cr_assert_eq(dist_npy_parse(b, cut, &dt, &s, &data, &n, &eb), DIST_EINVAL, "cut %zu: %s", cut,
                 eb.msg);
    free(b);
  }
  free(full);
}

/* Random byte mutations of a valid header never crash or over-read, and any
 * success describes data that fits in the buffer. */
Test(npy_parse, mutated_headers_stay_in_bounds) {
  size_t len;
  unsigned char *orig = build(F4_23, 1, 24, &len);
  static const unsigned char alphabet[] = "{}()[],:' \"0123456789<>|fiubTrueFalse\n\x00\xff";
  srand(1234);
  for (int iter = 0; iter < 20000; iter++) {
    unsigned char *b = malloc(len);
    memcpy(b, orig, len);
    int edits = 1 + rand() % 4;
    for (int e = 0; e < edits; e++) {
      size_t at = 6 + (size_t)rand() % 60;
      b[at] = rand() % 2 ? alphabet[rand() % (sizeof alphabet - 1)] : (unsigned char)rand();
    }
    dist_dtype dt = DIST_DTYPE_INVALID;
    dist_shape s;
    const void *data;
    size_t n;
    if (dist_npy_parse(b, len, &dt, &s, &data, &n, NULL) == 0) {
      cr_assert((const unsigned char *)data + n <= b + len);
      cr_assert_eq((uint64_t)dist_shape_numel(&s) * dist_dtype_size(dt), n);
    }
    free(b);
  }
  free(orig);
}
