/* The table-driven configuration (common/config.c) and distd's table and
 * membership (daemon/config.c). */
#include <criterion/criterion.h>
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../daemon/config.h" /* which includes common/config.h */


/* ---- A small table with one option of every type ------------------------ */

typedef struct {
  char *name;
  int64_t count;   /* -5 .. 5000 */
  int64_t any;     /* no bounds */
  uint64_t buffer; /* 1K .. 1G */
  uint64_t limit;  /* no bounds */
  int64_t wait_ms; /* 10ms .. 1h */
  int verbose;
  int color;
} tcfg;

static const char *const colors[] = {"red", "green", "blue", NULL};

#define T_OPT(f, type, def, lo, hi, ch, help) \
  {#f, type, offsetof(tcfg, f), def, lo, hi, ch, help}
static const dist_cfg_option topts[] = {
    T_OPT(name, DIST_CFG_STRING, "anon", 0, 0, NULL, "A name."),
    T_OPT(count, DIST_CFG_INT, "3", -5, 5000, NULL, "A count."),
    T_OPT(any, DIST_CFG_INT, "0", 0, 0, NULL, "Any integer."),
    T_OPT(buffer, DIST_CFG_SIZE, "64K", 1024, 1 << 30, NULL, "A buffer."),
    T_OPT(limit, DIST_CFG_SIZE, "0", 0, 0, NULL, "A limit."),
    {"wait", DIST_CFG_DURATION, offsetof(tcfg, wait_ms), "1s", 10, 3600000,
     NULL, "A wait."},
    T_OPT(verbose, DIST_CFG_BOOL, "false", 0, 0, NULL, "Talk more."),
    T_OPT(color, DIST_CFG_ENUM, "green", 0, 0, colors, "A color."),
};
static const dist_cfg_table ttable = {"tprog", "TPROG_", topts,
                                      sizeof topts / sizeof topts[0]};

static tcfg t;
static dist_errbuf eb;

static void tsetup(void) {
  memset(&eb, 0, sizeof eb);
  cr_assert_eq(dist_cfg_defaults(&ttable, &t, &eb), 0, "%s", eb.msg);
}
static void tteardown(void) { dist_cfg_free(&ttable, &t); }

/* Sets name=value from the command line; returns the result code. */
static int tset(const char *name, const char *value) {
  memset(&eb, 0, sizeof eb);
  return dist_cfg_set(&ttable, &t, name, value, NULL, &eb);
}

static void expect_error(int rc, const char *msg) {
  cr_assert_eq(rc, DIST_ECONFIG, "rc %d, msg '%s'", rc, eb.msg);
  cr_assert_eq(eb.code, DIST_ECONFIG);
  cr_assert_str_eq(eb.msg, msg);
}

TestSuite(config_types, .init = tsetup, .fini = tteardown);

Test(config_types, defaults_come_from_the_table) {
  cr_assert_str_eq(t.name, "anon");
  cr_assert_eq(t.count, 3);
  cr_assert_eq(t.buffer, 64 * 1024);
  cr_assert_eq(t.limit, 0);
  cr_assert_eq(t.wait_ms, 1000);
  cr_assert_eq(t.verbose, 0);
  cr_assert_eq(t.color, 1);
}

Test(config_types, int_accepts_signed_decimals_within_bounds) {
  cr_assert_eq(tset("count", "42"), 0);
  cr_assert_eq(t.count, 42);
  cr_assert_eq(tset("count", "-5"), 0);
  cr_assert_eq(t.count, -5);
  cr_assert_eq(tset("count", "+5000"), 0);
  cr_assert_eq(t.count, 5000);
  cr_assert_eq(tset("any", "-9223372036854775808"), 0);
  cr_assert_eq(t.any, INT64_MIN);
}

Test(config_types, int_rejects_junk_and_out_of_range) {
  expect_error(tset("count", "12abc"), "count: bad integer '12abc'");
  expect_error(tset("count", "0x10"), "count: bad integer '0x10'");
  expect_error(tset("count", " 5"), "count: bad integer ' 5'");
  expect_error(tset("count", ""), "count: missing value");
  expect_error(tset("count", "5001"), "count: value 5001 out of range [-5, 5000]");
  expect_error(tset("count", "-6"), "count: value -6 out of range [-5, 5000]");
  expect_error(tset("any", "9223372036854775808"),
               "any: value 9223372036854775808 out of range "
               "[-9223372036854775808, 9223372036854775807]");
  cr_assert_eq(t.count, 3, "a failed set leaves the old value");
}

Test(config_types, size_takes_binary_suffixes) {
  static const struct { const char *text; uint64_t bytes; } cases[] = {
      {"512", 512},          {"0", 0},
      {"64K", 65536},        {"64k", 65536},
      {"16M", 16777216},     {"2G", 2147483648ull},
      {"1T", 1099511627776ull}, {"4KiB", 4096},
      {"10MB", 10485760},    {"100B", 100},
      {"18446744073709551615", UINT64_MAX},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    cr_assert_eq(tset("limit", cases[i].text), 0, "%s: %s", cases[i].text, eb.msg);
    cr_assert_eq(t.limit, cases[i].bytes, "%s", cases[i].text);
  }
}

/* Each of the n texts in bad, set as key, is refused as "KEY: bad KIND
 * 'TEXT' (expected e.g. EXAMPLES)". */
static void expect_each_bad(const char *key, const char *kind, const char *examples,
                            const char *const *bad, size_t n) {
  for (size_t i = 0; i < n; i++) {
    char want[160];
    snprintf(want, sizeof want, "%s: bad %s '%s' (expected e.g. %s)", key, kind, bad[i],
             examples);
    expect_error(tset(key, bad[i]), want);
  }
}

Test(config_types, size_rejects_junk_and_out_of_range) {
  static const char *const bad[] = {"1.5G", "-1", "K", "1X", "1KK", "G1", "1 K"};
  expect_each_bad("limit", "size", "512, 64K, 16M, 2G", bad, sizeof bad / sizeof bad[0]);
  expect_error(tset("limit", "16777216T"),
               "limit: value 16777216T out of range [0, 18446744073709551615]");
  expect_error(tset("limit", "99999999999999999999"),
               "limit: value 99999999999999999999 out of range "
               "[0, 18446744073709551615]");
  expect_error(tset("buffer", "1023"), "buffer: value 1023 out of range [1K, 1G]");
  expect_error(tset("buffer", "2G"), "buffer: value 2G out of range [1K, 1G]");
  cr_assert_eq(tset("buffer", "1G"), 0);
  cr_assert_eq(t.buffer, 1u << 30);
}

Test(config_types, duration_takes_units_and_bare_milliseconds) {
  static const struct { const char *text; int64_t ms; } cases[] = {
      {"250ms", 250}, {"30s", 30000}, {"5m", 300000}, {"1h", 3600000},
      {"1500", 1500}, {"10", 10},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    cr_assert_eq(tset("wait", cases[i].text), 0, "%s: %s", cases[i].text, eb.msg);
    cr_assert_eq(t.wait_ms, cases[i].ms, "%s", cases[i].text);
  }
}

Test(config_types, duration_rejects_junk_and_out_of_range) {
  static const char *const bad[] = {"abc", "5d", "-1s", "1.5s", "s", "30 s", "30S"};
  expect_each_bad("wait", "duration", "250ms, 30s, 5m", bad, sizeof bad / sizeof bad[0]);
  expect_error(tset("wait", "9ms"), "wait: value 9ms out of range [10ms, 1h]");
  expect_error(tset("wait", "61m"), "wait: value 61m out of range [10ms, 1h]");
  expect_error(tset("wait", "9999999999999999h"),
               "wait: value 9999999999999999h out of range [10ms, 1h]");
}

Test(config_types, bool_takes_the_usual_words) {
  static const char *const yes[] = {"true", "yes", "on", "1", "TRUE", "On"};
  static const char *const no[] = {"false", "no", "off", "0", "False", "NO"};
  for (size_t i = 0; i < 6; i++) {
    cr_assert_eq(tset("verbose", yes[i]), 0);
    cr_assert_eq(t.verbose, 1, "%s", yes[i]);
    cr_assert_eq(tset("verbose", no[i]), 0);
    cr_assert_eq(t.verbose, 0, "%s", no[i]);
  }
  expect_error(tset("verbose", "maybe"),
               "verbose: bad boolean 'maybe' (expected true or false)");
}

Test(config_types, enum_takes_a_choice_in_any_case) {
  cr_assert_eq(tset("color", "blue"), 0);
  cr_assert_eq(t.color, 2);
  cr_assert_eq(tset("color", "RED"), 0);
  cr_assert_eq(t.color, 0);
  expect_error(tset("color", "teal"), "color: 'teal' is not one of red, green, blue");
}

Test(config_types, string_takes_anything_including_empty) {
  cr_assert_eq(tset("name", ""), 0);
  cr_assert_str_eq(t.name, "");
  cr_assert_eq(tset("name", " a # b "), 0);
  cr_assert_str_eq(t.name, " a # b ");
}

/* Run under ASan: the first copy must be freed when the second replaces it,
 * and dist_cfg_free must free the last one. */
Test(config_types, string_set_twice_does_not_leak) {
  cr_assert_eq(tset("name", "first"), 0);
  cr_assert_eq(tset("name", "second"), 0);
  cr_assert_str_eq(t.name, "second");
  dist_cfg_free(&ttable, &t);
  cr_assert_null(t.name);
  dist_cfg_free(&ttable, &t); /* twice is harmless */
  dist_cfg_free(&ttable, NULL);
}

Test(config_types, unknown_key_is_named_with_a_hint) {
  memset(&eb, 0, sizeof eb);
  expect_error(dist_cfg_set(&ttable, &t, "cont", "1", "--cont", &eb),
               "--cont: unknown key 'cont' (did you mean 'count'?)");
  memset(&eb, 0, sizeof eb);
  expect_error(dist_cfg_set(&ttable, &t, "zzzzzzzz", "1", "x", &eb),
               "x: unknown key 'zzzzzzzz'");
}

/* A deliberately broken table: its defaults are reported, not ignored. */
Test(config_types, bad_default_in_a_table_is_reported) {
  static const dist_cfg_option bad[] = {
      {"n", DIST_CFG_INT, 0, "lots", 0, 0, NULL, "n"}};
  static const dist_cfg_table bt = {"b", "B_", bad, 1};
  int64_t n;
  expect_error(dist_cfg_defaults(&bt, &n, &eb), "default of n: bad integer 'lots'");
}

/* ---- The config file ----------------------------------------------------- */

Test(config_types, file_lines_comments_whitespace_and_quotes) {
  const char *text =
      "# a comment\n"
      "\n"
      "   count   =   7   \n"
      "\tname=\"  spaced # not a comment  \"   # a comment\n"
      "wait = 2s # trailing comment\r\n"
      "color = blue\r\n"
      "   # indented comment\n"
      "verbose = yes";
  cr_assert_eq(dist_cfg_parse_file_text(&ttable, &t, text, "t.conf", &eb), 0,
               "%s", eb.msg);
  cr_assert_eq(t.count, 7);
  cr_assert_str_eq(t.name, "  spaced # not a comment  ");
  cr_assert_eq(t.wait_ms, 2000);
  cr_assert_eq(t.color, 2);
  cr_assert_eq(t.verbose, 1);
}

Test(config_types, file_quoted_values_escape_quotes_and_may_be_empty) {
  cr_assert_eq(dist_cfg_parse_file_text(&ttable, &t, "name = \"\"\n", "t.conf", &eb), 0);
  cr_assert_str_eq(t.name, "");
  cr_assert_eq(dist_cfg_parse_file_text(&ttable, &t, "name = \"a\\\"b\\\\c\"", "t.conf",
                                        &eb), 0);
  cr_assert_str_eq(t.name, "a\"b\\c");
  cr_assert_eq(dist_cfg_parse_file_text(&ttable, &t, "name =", "t.conf", &eb), 0);
  cr_assert_str_eq(t.name, "");
}

Test(config_types, file_later_line_wins) {
  cr_assert_eq(dist_cfg_parse_file_text(&ttable, &t, "count = 1\ncount = 2\n", "t.conf",
                                        &eb), 0);
  cr_assert_eq(t.count, 2);
}

Test(config_types, file_errors_name_file_and_line) {
  expect_error(dist_cfg_parse_file_text(&ttable, &t, "\n\ncount = x\n", "t.conf", &eb),
               "t.conf:3: count: bad integer 'x'");
  expect_error(dist_cfg_parse_file_text(&ttable, &t, "count\n", "t.conf", &eb),
               "t.conf:1: count: missing value (expected 'count = VALUE')");
  expect_error(dist_cfg_parse_file_text(&ttable, &t, "count = \n", "t.conf", &eb),
               "t.conf:1: count: missing value");
  expect_error(dist_cfg_parse_file_text(&ttable, &t, "a\n= 3\n", "t.conf", &eb),
               "t.conf:1: unknown key 'a'");
  expect_error(dist_cfg_parse_file_text(&ttable, &t, "= 3\n", "t.conf", &eb),
               "t.conf:1: missing key before '='");
  expect_error(dist_cfg_parse_file_text(&ttable, &t, "name = \"abc\n", "t.conf", &eb),
               "t.conf:1: name: unterminated or malformed quoted value");
  expect_error(dist_cfg_parse_file_text(&ttable, &t, "name = \"a\" b\n", "t.conf", &eb),
               "t.conf:1: name: unterminated or malformed quoted value");
  expect_error(dist_cfg_parse_file_text(&ttable, &t, "count = 99999\n", "t.conf", &eb),
               "t.conf:1: count: value 99999 out of range [-5, 5000]");
}

Test(config_types, missing_file_is_named) {
  expect_error(dist_cfg_load_file(&ttable, &t, "/nonexistent/t.conf", &eb),
               "cannot read config file '/nonexistent/t.conf': No such file or "
               "directory");
}

Test(config_types, bare_bool_flag_means_true) {
  char *argv[] = {"tprog", "--verbose", "--count=4", NULL};
  dist_cfg_action action;
  dist_cfg_free(&ttable, &t);
  cr_assert_eq(dist_cfg_load(&ttable, &t, 3, argv, NULL, &action, stdout, &eb), 0,
               "%s", eb.msg);
  cr_assert_eq(t.verbose, 1);
  cr_assert_eq(t.count, 4);
  char *argv2[] = {"tprog", "--verbose=off", NULL};
  dist_cfg_free(&ttable, &t);
  cr_assert_eq(dist_cfg_load(&ttable, &t, 2, argv2, NULL, &action, stdout, &eb), 0);
  cr_assert_eq(t.verbose, 0);
}

/* ---- distd: loading the whole configuration ------------------------------ */

static distd_config cfg;
static char tmpdir[64];
static char *out_text;
static size_t out_len;

static void dsetup(void) {
  memset(&eb, 0, sizeof eb);
  strcpy(tmpdir, "/tmp/test_config_XXXXXX");
  cr_assert_not_null(mkdtemp(tmpdir));
  out_text = NULL;
  out_len = 0;
}

static void dteardown(void) {
  dist_cfg_free(&distd_config_table, &cfg);
  free(out_text);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  cr_assert_eq(system(cmd), 0);
}

/* Writes text to tmpdir/name and returns the path (static buffer). */
static const char *write_file(const char *name, const char *text) {
  static char path[128];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fputs(text, f);
  fclose(f);
  return path;
}

static int count_args(char **v) {
  int n = 0;
  while (v && v[n]) n++;
  return n;
}

/* Runs dist_cfg_load on distd's table; what it prints goes to out_text. */
static int load(char **argv, char **envp, dist_cfg_action *action) {
  free(out_text);
  out_text = NULL;
  dist_cfg_free(&distd_config_table, &cfg); /* a test may load twice */
  FILE *out = open_memstream(&out_text, &out_len);
  cr_assert_not_null(out);
  memset(&eb, 0, sizeof eb);
  int rc = dist_cfg_load(&distd_config_table, &cfg, count_args(argv), argv, envp,
                         action, out, &eb);
  fclose(out);
  return rc;
}

TestSuite(distd_config, .init = dsetup, .fini = dteardown);

static const char *const default_dump =
    "listen = 127.0.0.1:7470\n"
    "peer_listen = \"\"\n"
    "http_listen = \"\"\n"
    "cluster_file = \"\"\n"
    "peers = \"\"\n"
    "rank = 0\n"
    "cluster_id = distd\n"
    "memory_limit = 0\n"
    "max_message_size = 1G\n"
    "peer_timeout = 30s\n"
    "peer_unexpected_max_age = 0ms\n"
    "connect_backoff_min = 100ms\n"
    "connect_backoff_max = 5s\n"
    "peer_spin_us = 5000\n"
    "peer_io_uring = true\n"
    "peer_congestion = reno\n"
    "peer_socket_buffer = 0\n"
    "rpc_threads = 8\n"
    "cpu_affinity = \"\"\n"
    "log_level = info\n"
    "log_format = plain\n"
    "tls_cert = \"\"\n"
    "tls_key = \"\"\n"
    "tls_ca = \"\"\n"
    "tls_crl = \"\"\n"
    "tls_client_auth = none\n"
    "peer_tls = auto\n"
    "auth_tokens_file = \"\"\n"
    "max_tensor_bytes = 0\n"
    "max_inflight_per_client = 0\n"
    "max_call_duration = 10m\n"
    "max_frame_size = 1G\n";

Test(distd_config, no_arguments_gives_the_documented_defaults) {
  char *argv[] = {"distd", NULL};
  dist_cfg_action action = DIST_CFG_EXIT_OK;
  cr_assert_eq(load(argv, NULL, &action), 0, "%s", eb.msg);
  cr_assert_eq(action, DIST_CFG_RUN);
  cr_assert_str_eq(cfg.listen, "127.0.0.1:7470");
  cr_assert_str_eq(cfg.peer_listen, "");
  cr_assert_str_eq(cfg.http_listen, "");
  cr_assert_str_eq(cfg.cluster_file, "");
  cr_assert_str_eq(cfg.peers, "");
  cr_assert_eq(cfg.rank, 0);
  cr_assert_str_eq(cfg.cluster_id, "distd");
  cr_assert_eq(cfg.memory_limit, 0);
  cr_assert_eq(cfg.max_message_size, 1ull << 30);
  cr_assert_eq(cfg.peer_timeout_ms, 30000);
  cr_assert_eq(cfg.peer_unexpected_max_age_ms, 0, "0: tied to peer_timeout");
  cr_assert_eq(cfg.connect_backoff_min_ms, 100);
  cr_assert_eq(cfg.connect_backoff_max_ms, 5000);
  cr_assert_eq(cfg.rpc_threads, 8);
  cr_assert_eq(cfg.log_level, 2);
  cr_assert_eq(cfg.log_format, 0);
  cr_assert_str_eq(out_text, "", "a normal load prints nothing");
}

Test(distd_config, check_config_prints_effective_values_in_table_order) {
  char *argv[] = {"distd", "--check-config", NULL};
  dist_cfg_action action;
  cr_assert_eq(load(argv, NULL, &action), 0, "%s", eb.msg);
  cr_assert_eq(action, DIST_CFG_EXIT_OK);
  cr_assert_str_eq(out_text, default_dump);
}

Test(distd_config, check_config_shows_values_from_every_source) {
  const char *path = write_file("distd.conf", "cluster_id = \"my #1\"\nrpc_threads = 4\n");
  char env_cfg[160];
  snprintf(env_cfg, sizeof env_cfg, "DISTD_CONFIG=%s", path);
  char *argv[] = {"distd", "--check-config", "--rank", "7", "--peers=a:1,b:2", NULL};
  char *envp[] = {env_cfg, "DISTD_PEER_TIMEOUT=90s", "DISTD_LOG_FORMAT=json", NULL};
  dist_cfg_action action;
  cr_assert_eq(load(argv, envp, &action), 0, "%s", eb.msg);
  cr_assert_eq(action, DIST_CFG_EXIT_OK);
  cr_assert_str_eq(out_text,
                   "listen = 127.0.0.1:7470\n"
                   "peer_listen = \"\"\n"
                   "http_listen = \"\"\n"
                   "cluster_file = \"\"\n"
                   "peers = a:1,b:2\n"
                   "rank = 7\n"
                   "cluster_id = \"my #1\"\n"
                   "memory_limit = 0\n"
                   "max_message_size = 1G\n"
                   "peer_timeout = 90s\n"
                   "peer_unexpected_max_age = 0ms\n"
                   "connect_backoff_min = 100ms\n"
                   "connect_backoff_max = 5s\n"
                   "peer_spin_us = 5000\n"
                   "peer_io_uring = true\n"
                   "peer_congestion = reno\n"
                   "peer_socket_buffer = 0\n"
                   "rpc_threads = 4\n"
                   "cpu_affinity = \"\"\n"
                   "log_level = info\n"
                   "log_format = json\n"
                   "tls_cert = \"\"\n"
                   "tls_key = \"\"\n"
                   "tls_ca = \"\"\n"
                   "tls_crl = \"\"\n"
                   "tls_client_auth = none\n"
                   "peer_tls = auto\n"
                   "auth_tokens_file = \"\"\n"
                   "max_tensor_bytes = 0\n"
                   "max_inflight_per_client = 0\n"
                   "max_call_duration = 10m\n"
                   "max_frame_size = 1G\n");
}

/* What --check-config prints is itself a valid config file that gives the
 * same configuration back. */
Test(distd_config, check_config_output_reads_back_as_the_same_config) {
  char *argv[] = {"distd", "--check-config", "--cluster-id", " odd \"id\" # x ",
                  "--memory-limit=1536", "--connect-backoff-min=1500", NULL};
  dist_cfg_action action;
  cr_assert_eq(load(argv, NULL, &action), 0, "%s", eb.msg);
  char *first = strdup(out_text);
  distd_config again;
  cr_assert_eq(dist_cfg_defaults(&distd_config_table, &again, &eb), 0);
  cr_assert_eq(dist_cfg_parse_file_text(&distd_config_table, &again, first, "dump",
                                        &eb), 0, "%s", eb.msg);
  cr_assert_str_eq(again.cluster_id, " odd \"id\" # x ");
  cr_assert_eq(again.memory_limit, 1536);
  cr_assert_eq(again.connect_backoff_min_ms, 1500);
  char *second = NULL;
  size_t len;
  FILE *f = open_memstream(&second, &len);
  dist_cfg_print(&distd_config_table, &again, f);
  fclose(f);
  cr_assert_str_eq(second, first);
  free(first);
  free(second);
  dist_cfg_free(&distd_config_table, &again);
}

Test(distd_config, check_config_with_a_bad_config_fails_like_a_load) {
  const char *path = write_file("distd.conf", "rnak = 1\n");
  char *argv[] = {"distd", "--check-config", "--config", (char *)path, NULL};
  dist_cfg_action action;
  cr_assert_eq(load(argv, NULL, &action), DIST_ECONFIG);
  cr_assert_eq(action, DIST_CFG_RUN);
  cr_assert_str_eq(out_text, "", "nothing is printed on failure");
  char want[256];
  snprintf(want, sizeof want, "%s:1: unknown key 'rnak' (did you mean 'rank'?)", path);
  cr_assert_str_eq(eb.msg, want);
  cr_assert_null(cfg.listen, "strings are freed on failure");
}

Test(distd_config, precedence_is_defaults_file_env_flags) {
  const char *path = write_file("distd.conf",
                                "rank = 1\n"
                                "peer_timeout = 1s\n"
                                "cluster_id = from-file\n"
                                "log_level = warn\n");
  char env_cfg[160];
  snprintf(env_cfg, sizeof env_cfg, "DISTD_CONFIG=%s", path);
  char *argv[] = {"distd", "--rank=3", "--log-level", "debug", NULL};
  char *envp[] = {"PATH=/usr/bin", env_cfg, "DISTD_RANK=2",
                  "DISTD_PEER_TIMEOUT=2s", "DISTD_LOG_LEVEL=error",
                  "DIST_RANK=9", NULL};
  dist_cfg_action action;
  cr_assert_eq(load(argv, envp, &action), 0, "%s", eb.msg);
  cr_assert_eq(cfg.rank, 3, "flag beats env and file");
  cr_assert_eq(cfg.log_level, 3, "flag beats env and file");
  cr_assert_eq(cfg.peer_timeout_ms, 2000, "env beats file");
  cr_assert_str_eq(cfg.cluster_id, "from-file", "file beats default");
  cr_assert_eq(cfg.rpc_threads, 8, "default when nobody sets it");
}

Test(distd_config, config_flag_beats_config_env) {
  const char *a = write_file("a.conf", "rank = 1\n");
  char env_cfg[160];
  snprintf(env_cfg, sizeof env_cfg, "DISTD_CONFIG=%s", a);
  char b[160];
  snprintf(b, sizeof b, "%s", write_file("b.conf", "rank = 2\n"));
  char *argv[] = {"distd", "--config", b, NULL};
  char *envp[] = {env_cfg, NULL};
  dist_cfg_action action;
  cr_assert_eq(load(argv, envp, &action), 0, "%s", eb.msg);
  cr_assert_eq(cfg.rank, 2);
}

Test(distd_config, later_flag_wins) {
  char *argv[] = {"distd", "--rank=1", "--rank", "2", NULL};
  dist_cfg_action action;
  cr_assert_eq(load(argv, NULL, &action), 0, "%s", eb.msg);
  cr_assert_eq(cfg.rank, 2);
}

/* The errors of the issue, each with its origin. */
static void expect_load_error(char **argv, char **envp, const char *msg) {
  dist_cfg_action action = DIST_CFG_EXIT_OK;
  cr_assert_eq(load(argv, envp, &action), DIST_ECONFIG, "expected '%s'", msg);
  cr_assert_eq(eb.code, DIST_ECONFIG);
  cr_assert_eq(action, DIST_CFG_RUN);
  cr_assert_str_eq(eb.msg, msg);
}

Test(distd_config, unknown_key_in_file_names_file_and_line) {
  char text[256] = "";
  for (int i = 1; i < 12; i++) strcat(text, i % 2 ? "# filler\n" : "rank = 1\n");
  strcat(text, "rnak = 2\n");
  const char *path = write_file("distd.conf", text);
  cr_assert_eq(chdir(tmpdir), 0);
  char *argv[] = {"distd", "--config=distd.conf", NULL};
  (void)path;
  expect_load_error(argv, NULL, "distd.conf:12: unknown key 'rnak' (did you mean 'rank'?)");
}

Test(distd_config, bad_duration_in_file_names_file_line_and_key) {
  write_file("distd.conf", "rank = 1\n\npeer_timeout = abc\n");
  cr_assert_eq(chdir(tmpdir), 0);
  char *envp[] = {"DISTD_CONFIG=distd.conf", NULL};
  char *argv[] = {"distd", NULL};
  expect_load_error(argv, envp,
                    "distd.conf:3: peer_timeout: bad duration 'abc' (expected e.g. "
                    "250ms, 30s, 5m)");
}

Test(distd_config, flag_out_of_range_names_the_flag) {
  char *argv[] = {"distd", "--rank=99999999999", NULL};
  expect_load_error(argv, NULL, "--rank: value 99999999999 out of range [0, 65535]");
  char *argv2[] = {"distd", "--rpc-threads", "0", NULL};
  expect_load_error(argv2, NULL, "--rpc-threads: value 0 out of range [1, 256]");
  char *argv3[] = {"distd", "--max-message-size=4G", NULL};
  expect_load_error(argv3, NULL,
                    "--max-message-size: value 4G out of range [1K, 2147483647]");
}

Test(distd_config, bad_enum_in_env_names_the_variable) {
  char *argv[] = {"distd", NULL};
  char *envp[] = {"DISTD_LOG_LEVEL=loud", NULL};
  expect_load_error(argv, envp,
                    "DISTD_LOG_LEVEL: 'loud' is not one of error, warn, info, debug");
}

Test(distd_config, missing_values_are_errors) {
  char *argv[] = {"distd", "--rank", NULL};
  expect_load_error(argv, NULL, "--rank: missing value");
  char *argv2[] = {"distd", "--peers", "--rank=1", NULL};
  expect_load_error(argv2, NULL, "--peers: missing value");
  char *argv3[] = {"distd", "--config", NULL};
  expect_load_error(argv3, NULL, "--config: missing value");
  char *argv4[] = {"distd", NULL};
  char *envp4[] = {"DISTD_RPC_THREADS=", NULL};
  expect_load_error(argv4, envp4, "DISTD_RPC_THREADS: missing value");
}

Test(distd_config, empty_string_flag_is_a_value) {
  char *argv[] = {"distd", "--cluster-id=", "--peers", "", NULL};
  dist_cfg_action action;
  cr_assert_eq(load(argv, NULL, &action), 0, "%s", eb.msg);
  cr_assert_str_eq(cfg.cluster_id, "");
}

Test(distd_config, unknown_flags_are_errors) {
  char *argv[] = {"distd", "--bogus=1", NULL};
  expect_load_error(argv, NULL, "unknown flag '--bogus'");
  char *argv2[] = {"distd", "--peer_timeout=1s", NULL};
  expect_load_error(argv2, NULL,
                    "unknown flag '--peer_timeout' (did you mean '--peer-timeout'?)");
  char *argv3[] = {"distd", "-r", "1", NULL};
  expect_load_error(argv3, NULL, "unknown flag '-r'");
  char *argv4[] = {"distd", "--check-config=yes", NULL};
  expect_load_error(argv4, NULL, "--check-config: takes no value");
}

Test(distd_config, unknown_flag_is_reported_before_the_file_is_read) {
  char *argv[] = {"distd", "--config=/nonexistent.conf", "--bogus", NULL};
  expect_load_error(argv, NULL, "unknown flag '--bogus'");
}

Test(distd_config, positional_arguments_are_rejected) {
  char *argv[] = {"distd", "--rank=1", "serve", NULL};
  expect_load_error(argv, NULL,
                    "unexpected argument 'serve' (distd takes no positional arguments)");
  char *argv2[] = {"distd", "--", "x", NULL};
  expect_load_error(argv2, NULL,
                    "unexpected argument '--' (distd takes no positional arguments)");
}

Test(distd_config, unknown_prefixed_env_var_is_an_error_except_config) {
  char *argv[] = {"distd", NULL};
  char *envp[] = {"DISTD_CONFIG=", "DISTD_RNAK=1", NULL};
  expect_load_error(argv, envp,
                    "DISTD_RNAK: unknown environment variable: no distd option has "
                    "that name (did you mean 'DISTD_RANK'?)");
  char *envp2[] = {"DISTD_=1", NULL};
  expect_load_error(argv, envp2,
                    "DISTD_: unknown environment variable: no distd option has that name");
  char *envp3[] = {"DISTD_rank=1", NULL};
  expect_load_error(argv, envp3,
                    "DISTD_rank: unknown environment variable: no distd option has "
                    "that name (did you mean 'DISTD_RANK'?)");
  /* DISTD_CONFIG alone, empty, names no file and is fine. */
  char *envp4[] = {"DISTD_CONFIG=", "DISTDX=1", NULL};
  dist_cfg_action action;
  cr_assert_eq(load(argv, envp4, &action), 0, "%s", eb.msg);
}

Test(distd_config, missing_config_file_is_an_error) {
  char *argv[] = {"distd", "--config", "/nonexistent/distd.conf", NULL};
  expect_load_error(argv, NULL,
                    "cannot read config file '/nonexistent/distd.conf': No such file "
                    "or directory");
}

/* A malloc'd copy of s with every run of blanks and newlines as one space. */
static char *squeeze_blanks(const char *s) {
  char *copy = strdup(s), *w = copy;
  for (; *s; s++) {
    bool blank = isspace((unsigned char)*s);
    if (blank && w > copy && w[-1] == ' ') continue;
    *w++ = blank ? ' ' : *s;
  }
  *w = 0;
  return copy;
}

Test(distd_config, help_lists_every_option_with_flag_env_default_and_help) {
  char *argv[] = {"distd", "--rank=99999999999", "--help", "--bogus", NULL};
  dist_cfg_action action;
  cr_assert_eq(load(argv, NULL, &action), 0, "%s", eb.msg);
  cr_assert_eq(action, DIST_CFG_EXIT_OK);
  cr_assert(strncmp(out_text, "usage: distd ", 13) == 0, "%s", out_text);
  cr_assert_not_null(strstr(out_text, "--config=FILE"));
  cr_assert_not_null(strstr(out_text, "--check-config"));
  cr_assert_not_null(strstr(out_text, "DISTD_CONFIG"));
  /* Help texts are wrapped: compare them with every run of blanks as one. */
  char *flat = squeeze_blanks(out_text);
  for (const char *line = out_text; *line; line += strcspn(line, "\n") + 1) {
    int len = (int)strcspn(line, "\n");
    cr_assert(len <= 80, "line too long: %.*s", len, line);
  }
  for (size_t i = 0; i < distd_config_table.count; i++) {
    const dist_cfg_option *o = &distd_config_table.options[i];
    char flag[64], env[64], def[96];
    snprintf(flag, sizeof flag, "  --%s=", o->name);
    snprintf(env, sizeof env, "(env DISTD_%s, default ", o->name);
    for (char *p = flag + 4; *p; p++) *p = *p == '_' ? '-' : *p;
    for (char *p = env + 11; *p != ','; p++) *p = (char)toupper((unsigned char)*p);
    snprintf(def, sizeof def, o->type == DIST_CFG_STRING ? "%s\"%s\"" : "%s%s", env,
             o->def);
    cr_assert_not_null(strstr(out_text, flag), "%s missing", flag);
    cr_assert_not_null(strstr(out_text, def), "'%s' missing", def);
    cr_assert_not_null(strstr(flat, o->help), "help of %s missing", o->name);
    cr_assert(strlen(o->help) > 20, "help of %s says something", o->name);
  }
  cr_assert_not_null(strstr(out_text, "  --log-level=error|warn|info|debug\n"));
  cr_assert_not_null(strstr(out_text, "default 30s, range [10ms, 1h])"));
  cr_assert_not_null(strstr(out_text, "--rank=INT\n"));
  cr_assert_not_null(strstr(out_text, "default 0, range [0, 65535])"));
  free(flat);
}

/* ---- distd: membership --------------------------------------------------- */

static int members_for(char **argv, dist_member **m, int *n) {
  dist_cfg_action action;
  int rc = load(argv, NULL, &action);
  cr_assert_eq(rc, 0, "%s", eb.msg);
  memset(&eb, 0, sizeof eb);
  return distd_members_load(&cfg, m, n, &eb);
}

Test(distd_config, members_default_to_one_rank_at_listen) {
  char *argv[] = {"distd", "--listen=127.0.0.1:9000", NULL};
  dist_member *m;
  int n;
  cr_assert_eq(members_for(argv, &m, &n), 0, "%s", eb.msg);
  cr_assert_eq(n, 1);
  cr_assert_str_eq(m[0].grpc_addr, "127.0.0.1:9000");
  cr_assert_str_eq(m[0].peer_addr, "127.0.0.1:9001");
  free(m);
}

Test(distd_config, members_from_peers_in_rank_order) {
  char *argv[] = {"distd", "--rank=1",
                  "--peers= 127.0.0.1:7000 ,127.0.0.1:7010 127.0.0.1:7100,[::1]:7020",
                  NULL};
  dist_member *m;
  int n;
  cr_assert_eq(members_for(argv, &m, &n), 0, "%s", eb.msg);
  cr_assert_eq(n, 3);
  cr_assert_str_eq(m[0].grpc_addr, "127.0.0.1:7000");
  cr_assert_str_eq(m[0].peer_addr, "127.0.0.1:7001");
  cr_assert_str_eq(m[1].grpc_addr, "127.0.0.1:7010");
  cr_assert_str_eq(m[1].peer_addr, "127.0.0.1:7100");
  cr_assert_str_eq(m[2].grpc_addr, "[::1]:7020");
  free(m);
}

Test(distd_config, members_from_cluster_file) {
  const char *path = write_file("cluster.conf",
                                "# three daemons\n127.0.0.1:7000\n127.0.0.1:7010\n"
                                "127.0.0.1:7020  # last\n");
  char flag[160];
  snprintf(flag, sizeof flag, "--cluster-file=%s", path);
  char *argv[] = {"distd", flag, "--rank=2", NULL};
  dist_member *m;
  int n;
  cr_assert_eq(members_for(argv, &m, &n), 0, "%s", eb.msg);
  cr_assert_eq(n, 3);
  cr_assert_str_eq(m[2].grpc_addr, "127.0.0.1:7020");
  free(m);
}

Test(distd_config, rank_beyond_world_size_is_an_error) {
  char *argv[] = {"distd", "--rank=3", "--peers=127.0.0.1:7000,127.0.0.1:7010", NULL};
  dist_member *m = (dist_member *)&m;
  int n = 99;
  cr_assert_eq(members_for(argv, &m, &n), DIST_ECONFIG);
  cr_assert_str_eq(eb.msg, "rank 3 is out of range: the cluster has 2 daemons");
  cr_assert_null(m);
  cr_assert_eq(n, 0);
  char *argv2[] = {"distd", "--rank=1", NULL};
  cr_assert_eq(members_for(argv2, &m, &n), DIST_ECONFIG);
  cr_assert_str_eq(eb.msg, "rank 1 is out of range: the cluster has 1 daemon");
}

Test(distd_config, bad_membership_is_a_config_error) {
  dist_member *m;
  int n;
  char *argv[] = {"distd", "--peers=127.0.0.1:7000,,127.0.0.1:7010", NULL};
  cr_assert_eq(members_for(argv, &m, &n), DIST_ECONFIG);
  cr_assert_str_eq(eb.msg, "peers: entry 2 is empty in '127.0.0.1:7000,,127.0.0.1:7010'");

  char *argv2[] = {"distd", "--peers=127.0.0.1:7000,127.0.0.1:notaport", NULL};
  cr_assert_eq(members_for(argv2, &m, &n), DIST_ECONFIG);
  cr_assert_eq(eb.code, DIST_ECONFIG);
  cr_assert(strncmp(eb.msg, "peers:2:", 8) == 0, "names the entry: %s", eb.msg);

  char *argv3[] = {"distd", "--peers=a:1", "--cluster-file=/x", NULL};
  cr_assert_eq(members_for(argv3, &m, &n), DIST_ECONFIG);
  cr_assert_str_eq(eb.msg, "cluster_file and peers are both set; give only one");

  char *argv4[] = {"distd", "--cluster-file=/nonexistent/cluster.conf", NULL};
  cr_assert_eq(members_for(argv4, &m, &n), DIST_ECONFIG);
  cr_assert_not_null(strstr(eb.msg, "/nonexistent/cluster.conf"), "%s", eb.msg);
}
