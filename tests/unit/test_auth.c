/* The bearer-token file parser and lookup (daemon/auth.c). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth.h"

#define RO "monitoring-token-0123456789"
#define RW "trainer-token-abcdefghijklmn"

static distd_auth *parse_ok(const char *text) {
  distd_auth *a = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_auth_parse(text, "tokens", &a, &eb), 0, "%s", eb.msg);
  return a;
}

static void parse_fails(const char *text, const char *needle) {
  distd_auth *a = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_auth_parse(text, "tokens", &a, &eb), DIST_ECONFIG);
  cr_assert_null(a);
  cr_assert(strstr(eb.msg, needle), "message '%s' lacks '%s'", eb.msg, needle);
}

static distd_role role_of(const distd_auth *a, const char *tok) {
  return distd_auth_lookup(a, tok, strlen(tok));
}

Test(auth, two_roles_comments_and_blank_lines) {
  distd_auth *a = parse_ok("# tokens\n\n  " RO "  read-only   # grafana\n" RW "\tread-write\n");
  cr_assert_eq(distd_auth_count(a), 2);
  cr_assert_eq(role_of(a, RO), DISTD_ROLE_READ_ONLY);
  cr_assert_eq(role_of(a, RW), DISTD_ROLE_READ_WRITE);
  distd_auth_free(a);
}

Test(auth, last_line_without_newline_and_crlf) {
  distd_auth *a = parse_ok(RO " read-only\r\n" RW " read-write");
  cr_assert_eq(role_of(a, RO), DISTD_ROLE_READ_ONLY);
  cr_assert_eq(role_of(a, RW), DISTD_ROLE_READ_WRITE);
  distd_auth_free(a);
}

Test(auth, unknown_prefix_and_extended_tokens_are_refused) {
  distd_auth *a = parse_ok(RW " read-write\n");
  cr_assert_eq(role_of(a, "trainer-token-abcdefghijklm"), DISTD_ROLE_NONE);
  cr_assert_eq(role_of(a, RW "x"), DISTD_ROLE_NONE);
  cr_assert_eq(role_of(a, ""), DISTD_ROLE_NONE);
  cr_assert_eq(distd_auth_lookup(a, NULL, 0), DISTD_ROLE_NONE);
  cr_assert_eq(distd_auth_lookup(NULL, RW, strlen(RW)), DISTD_ROLE_NONE);
  distd_auth_free(a);
}

Test(auth, unknown_role_names_line_and_role) {
  parse_fails(RO " read-only\n" RW " admin\n", "tokens:2: unknown role 'admin'");
}

Test(auth, token_without_role) { parse_fails(RO "\n", "tokens:1: expected \"TOKEN ROLE\""); }

Test(auth, three_words) { parse_fails(RO " read-only extra\n", "more than two words"); }

Test(auth, short_token) { parse_fails("short read-only\n", "token of 5 characters"); }

Test(auth, duplicate_token) {
  parse_fails(RO " read-only\n" RO " read-write\n", "tokens:2: token listed twice");
}

Test(auth, empty_file_locks_everyone_out) {
  parse_fails("# nothing\n\n", "no tokens");
}

Test(auth, bearer_header) {
  const char *tok = NULL;
  const char *v = "Bearer " RW;
  cr_assert_eq(distd_auth_bearer(v, strlen(v), &tok), strlen(RW));
  cr_assert_eq(strncmp(tok, RW, strlen(RW)), 0);
  v = "bearer   abc  ";
  cr_assert_eq(distd_auth_bearer(v, strlen(v), &tok), 3);
  cr_assert_eq(strncmp(tok, "abc", 3), 0);
  v = "Basic dXNlcjpwdw==";
  cr_assert_eq(distd_auth_bearer(v, strlen(v), &tok), 0);
  v = "Bearer ";
  cr_assert_eq(distd_auth_bearer(v, strlen(v), &tok), 0);
}

static void write_file(const char *path, const char *text, mode_t mode) {
  FILE *f = fopen(path, "w");
  cr_assert(f);
  fputs(text, f);
  fclose(f);
  chmod(path, mode);
}

Test(auth, load_refuses_a_world_readable_file) {
  char path[] = "/tmp/distd-auth-XXXXXX";
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  close(fd);
  write_file(path, RW " read-write\n", 0644);
  distd_auth *a = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_auth_load(path, &a, &eb), DIST_ECONFIG);
  cr_assert(strstr(eb.msg, "chmod 600"), "%s", eb.msg);
  chmod(path, 0600);
  cr_assert_eq(distd_auth_load(path, &a, &eb), 0, "%s", eb.msg);
  cr_assert_eq(role_of(a, RW), DISTD_ROLE_READ_WRITE);
  distd_auth_free(a);
  unlink(path);
}

Test(auth, load_missing_file_names_it) {
  distd_auth *a = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(distd_auth_load("/nonexistent/tokens", &a, &eb), DIST_ECONFIG);
  cr_assert(strstr(eb.msg, "/nonexistent/tokens"), "%s", eb.msg);
}
