/* Security: TLS on the gRPC port and the data plane, certificate ranks,
 * mutual TLS for clients, bearer tokens and their roles, and the limits
 * that answer RESOURCE_EXHAUSTED. Certificates are made per test with the
 * openssl command line, the way docs/security.md tells operators to. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define RO_TOKEN "ro-token-0123456789abcdef"
#define RW_TOKEN "rw-token-fedcba9876543210"

static char certs[256];

static const char gen_script[] =
    "set -eu\n"
    "cd \"$1\"\n"
    "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \\\n"
    "  -keyout ca.key -out ca.crt -days 2 -subj /CN=distd-test-ca \\\n"
    "  -addext basicConstraints=critical,CA:TRUE \\\n"
    "  -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null\n"
    "mk() { # name subjectAltName extendedKeyUsage [signer]\n"
    "  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \\\n"
    "    -keyout $1.key -out $1.csr -subj /CN=$1 2>/dev/null\n"
    "  printf 'subjectAltName=%s\\nextendedKeyUsage=%s\\nkeyUsage=critical,digitalSignature\\n' \\\n"
    "    \"$2\" \"$3\" > $1.ext\n"
    "  openssl x509 -req -in $1.csr -CA ${4:-ca}.crt -CAkey ${4:-ca}.key -CAcreateserial \\\n"
    "    -out $1.crt -days 2 -extfile $1.ext 2>/dev/null\n"
    "  rm -f $1.csr $1.ext\n"
    "}\n"
    "# an intermediate CA, and ranks whose tls_cert is their chain: leaf, then it\n"
    "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \\\n"
    "  -keyout mid.key -out mid.csr -subj /CN=distd-test-mid 2>/dev/null\n"
    "printf 'basicConstraints=critical,CA:TRUE\\nkeyUsage=critical,keyCertSign,cRLSign\\n' > mid.ext\n"
    "openssl x509 -req -in mid.csr -CA ca.crt -CAkey ca.key -CAcreateserial \\\n"
    "  -out mid.crt -days 2 -extfile mid.ext 2>/dev/null\n"
    "rm -f mid.csr mid.ext\n"
    "for r in 0 1; do\n"
    "  mk chained$r DNS:distd-rank-$r,DNS:localhost,IP:127.0.0.1 serverAuth,clientAuth mid\n"
    "  cat mid.crt >> chained$r.crt\n"
    "done\n"
    "for r in 0 1 2; do\n"
    "  mk rank$r DNS:distd-rank-$r,DNS:localhost,IP:127.0.0.1 serverAuth,clientAuth\n"
    "done\n"
    "# a certificate the CA signed, but for rank 0, to be used by rank 1\n"
    "mk wrong DNS:distd-rank-0,DNS:localhost,IP:127.0.0.1 serverAuth,clientAuth\n"
    "mk client DNS:distd-client clientAuth\n"
    "mk client2 DNS:distd-client clientAuth\n"
    "# the CA's revocation database, for tls_crl (docs/security.md)\n"
    "printf '[ca]\\ndefault_ca=d\\n[d]\\ndatabase=index.txt\\ncrlnumber=crlnumber\\n"
    "default_md=sha256\\ndefault_crl_days=2\\n' > ca.cnf\n"
    ": > index.txt && echo 01 > crlnumber\n"
    "printf '# test tokens\\n" RO_TOKEN " read-only\\n" RW_TOKEN " read-write\\n' > tokens\n"
    "chmod 600 *.key tokens\n";

static void make_certs(void) {
  snprintf(certs, sizeof certs, "/tmp/distd-certs-XXXXXX");
  cr_assert(mkdtemp(certs));
  char script[300], cmd[700];
  snprintf(script, sizeof script, "%s/gen.sh", certs);
  FILE *f = fopen(script, "w");
  cr_assert(f);
  fputs(gen_script, f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "sh %s %s", script, certs);
  char *err = NULL;
  int rc = harness_run(cmd, NULL, &err, 60);
  cr_assert_eq(rc, 0, "generating certificates failed: %s", err ? err : "");
  free(err);
}

static void remove_certs(void) {
  if (harness_remove_dir(certs) != 0) fprintf(stderr, "cannot remove %s\n", certs);
}

static const char *cert_path(const char *name) {
  static char paths[16][320];
  static int next;
  char *p = paths[next++ % 16];
  snprintf(p, 320, "%s/%s", certs, name);
  return p;
}

/* Starts rank r with its certificate (rank_cert NULL: no TLS arguments)
 * and the common arguments; does not wait. */
static void start_rank(harness *h, int r, const char *rank_cert,
                       const char *const *common) {
  const char *args[32];
  int a = 0;
  if (rank_cert) {
    char crt[64], key[64];
    snprintf(crt, sizeof crt, "%s.crt", rank_cert);
    snprintf(key, sizeof key, "%s.key", rank_cert);
    args[a++] = "--tls-cert";
    args[a++] = cert_path(crt);
    args[a++] = "--tls-key";
    args[a++] = cert_path(key);
    args[a++] = "--tls-ca";
    args[a++] = cert_path("ca.crt");
  }
  for (int i = 0; common && common[i] && a < 30; i++) args[a++] = common[i];
  args[a] = NULL;
  harness_start_rank(h, r, args);
}

/* harness_start with per-rank arguments: each rank has its own
 * certificate. rank_cert[r] NULL means no TLS arguments. */
static void start_cluster(harness *h, int n, const char *const rank_cert[],
                          const char *const *common, int wait_peers) {
  harness_prepare(h, n);
  for (int r = 0; r < n; r++) start_rank(h, r, rank_cert ? rank_cert[r] : NULL, common);
  if (wait_peers) harness_assert_all_connected(h, "of its start");
}

/* Waits until rank r answers the health check (open to everyone). */
static void wait_serving(harness *h, int r) {
  for (int waited = 0; waited < 20000; waited += 100) {
    dist_client *c = harness_client_rank(h, r, 1000);
    int rc = dist_health(c, 0);
    dist_close(c);
    if (rc == 0) return;
    harness_sleep_ms(100);
  }
  cr_assert_fail("rank %d did not start serving within 20 s (log in %s)", r, h->dir);
}

static char *rank_log(harness *h, int r) {
  char path[320];
  snprintf(path, sizeof path, "%s/distd.%d.log", h->dir, r);
  FILE *f = fopen(path, "r");
  if (!f) return strdup("");
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  return strdup(buf);
}

static void use_tls_env(void) {
  setenv("DIST_TLS_CA", cert_path("ca.crt"), 1);
  unsetenv("DIST_TLS_CERT");
  unsetenv("DIST_TLS_KEY");
  unsetenv("DIST_TOKEN");
}

/* A 4x2 float tensor sharded over both ranks, resharded to rows over
 * columns, read back whole: its pieces cross the TLS data plane. */
static void move_tensor(dist_client *c) {
  float ref[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int64_t shape[2] = {4, 2};
  dist_mesh *mesh = NULL;
  cr_assert_eq(dist_mesh_from_string("[0,1]", NULL, &mesh), 0);
  dist_placement rows = DIST_SHARD_DIM(0), cols = DIST_SHARD_DIM(1);
  dist_tensor *t = NULL;
  cr_assert_eq(dist_shard_tensor(c, "w", ref, DIST_FLOAT32, 2, shape, mesh, &rows, &t), 0,
               "%s", dist_errmsg(c));
  cr_assert_eq(dist_reshard(c, t, NULL, &cols), 0, "reshard over TLS: %s", dist_errmsg(c));
  void *data = NULL;
  size_t n = 0;
  cr_assert_eq(dist_full_tensor(c, t, &data, &n), 0, "%s", dist_errmsg(c));
  cr_assert_eq(n, sizeof ref);
  cr_assert_eq(memcmp(data, ref, sizeof ref), 0, "tensor changed on its way");
  free(data);
  dist_tensor_free(t);
  dist_mesh_free(mesh);
}

Test(security, tls_cluster_serves_status_and_moves_tensors_between_peers) {
  make_certs();
  use_tls_env();
  harness h;
  const char *const certs_of[] = {"rank0", "rank1"};
  start_cluster(&h, 2, certs_of, NULL, 1);
  dist_client *c = harness_client(&h);
  dist_daemon_info info;
  cr_assert_eq(dist_info(c, 1, &info), 0, "%s", dist_errmsg(c));
  cr_assert_eq(info.rank, 1);
  cr_assert_str_eq(info.peer_io, "tls (the loop thread)");
  dist_info_free(&info);
  move_tensor(c);
  dist_close(c);
  char *log = rank_log(&h, 0);
  cr_expect_null(strstr(log, "without TLS"), "a loopback TLS daemon warned: %s", log);
  free(log);
  harness_stop(&h);
  remove_certs();
}

/* Certificates signed by an intermediate CA: each daemon's tls_cert holds
 * its chain (its own certificate, then the intermediate's) and tls_ca only
 * the root. The daemons send the chain, and the data plane (each daemon
 * verifying the other) and the client both accept it. */
Test(security, certificate_chains_are_sent_and_verified) {
  make_certs();
  use_tls_env();
  harness h;
  const char *const certs_of[] = {"chained0", "chained1"};
  start_cluster(&h, 2, certs_of, NULL, 1);
  dist_client *c = harness_client(&h);
  move_tensor(c);
  dist_close(c);
  harness_stop(&h);
  remove_certs();
}

Test(security, plaintext_client_against_tls_daemon_fails_clearly) {
  make_certs();
  use_tls_env();
  harness h;
  const char *const certs_of[] = {"rank0"};
  start_cluster(&h, 1, certs_of, NULL, 1);
  unsetenv("DIST_TLS_CA");
  dist_client *c = harness_client_rank(&h, 0, 2000);
  dist_daemon_info info;
  int rc = dist_info(c, 0, &info);
  cr_assert_eq(rc, DIST_EUNAVAIL, "plaintext Info gave %d: %s", rc, dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "cannot reach distd"), "%s", dist_errmsg(c));
  dist_close(c);
  harness_stop(&h);
  remove_certs();
}

Test(security, daemon_with_a_certificate_for_another_rank_is_refused) {
  make_certs();
  use_tls_env();
  harness h;
  const char *const certs_of[] = {"rank0", "wrong"};
  start_cluster(&h, 2, certs_of, NULL, 0);
  wait_serving(&h, 0);
  wait_serving(&h, 1);
  harness_sleep_ms(1500); /* several dial attempts in both directions */
  dist_client *c = harness_client_rank(&h, 0, 2000);
  dist_daemon_info info;
  cr_assert_eq(dist_info(c, 0, &info), 0, "%s", dist_errmsg(c));
  int seen = 0;
  for (int i = 0; i < info.npeers; i++)
    if (info.peers[i].rank == 1) {
      seen = 1;
      cr_assert_eq(info.peers[i].connected, 0, "rank 1 with rank 0's certificate got in");
    }
  cr_assert(seen, "rank 0 does not list rank 1");
  dist_info_free(&info);
  dist_close(c);
  /* Each refusal logged (bounded: the 1.5 s above need not hold a dial
   * each way on a loaded host). */
  const char *const accepted[] = {"claims rank 1 but its certificate is for rank 0", NULL};
  const char *const dialled[] = {"refused: its certificate is for rank 0", NULL};
  int told_accepted = harness_log_wait(&h, 0, 0, accepted, 10000);
  int told_dialled = harness_log_wait(&h, 0, 0, dialled, 10000);
  char *log = rank_log(&h, 0);
  cr_assert(told_accepted, "rank 0 did not log why it refused rank 1:\n%s", log);
  cr_assert(told_dialled, "rank 0 dialled rank 1 without noticing:\n%s", log);
  free(log);
  harness_stop(&h);
  remove_certs();
}

Test(security, mutual_tls_refuses_a_client_without_certificate) {
  make_certs();
  use_tls_env();
  setenv("DIST_TLS_CERT", cert_path("client.crt"), 1);
  setenv("DIST_TLS_KEY", cert_path("client.key"), 1);
  harness h;
  const char *const certs_of[] = {"rank0"};
  const char *const args[] = {"--tls-client-auth", "require", NULL};
  start_cluster(&h, 1, certs_of, args, 1);
  dist_client *c = harness_client_rank(&h, 0, 2000);
  dist_daemon_info info;
  cr_assert_eq(dist_info(c, 0, &info), 0, "with a client certificate: %s", dist_errmsg(c));
  dist_info_free(&info);
  dist_close(c);
  unsetenv("DIST_TLS_CERT");
  unsetenv("DIST_TLS_KEY");
  c = harness_client_rank(&h, 0, 2000);
  int rc = dist_info(c, 0, &info);
  cr_assert_eq(rc, DIST_EUNAVAIL, "without a client certificate: %d %s", rc, dist_errmsg(c));
  dist_close(c);
  harness_stop(&h);
  remove_certs();
}

static int put_small(dist_client *c, const char *name) {
  float v[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  dist_mesh *mesh = NULL;
  dist_mesh_from_string("[0]", NULL, &mesh);
  dist_placement rep = DIST_REPLICATED;
  dist_tensor *t = NULL;
  int rc = dist_shard_tensor(c, name, v, DIST_FLOAT32, 1, shape, mesh, &rep, &t);
  dist_tensor_free(t);
  dist_mesh_free(mesh);
  return rc;
}

static dist_client *client_with_token(harness *h, const char *token) {
  char ep[64];
  snprintf(ep, sizeof ep, "127.0.0.1:%d", h->grpc_port[0]);
  dist_opts o = DIST_OPTS_INIT;
  o.timeout_ms = 5000;
  o.token = token;
  dist_client *c = NULL;
  cr_assert_eq(dist_connect(ep, &o, &c), 0);
  return c;
}

Test(security, tokens_separate_read_only_from_read_write) {
  make_certs();
  unsetenv("DIST_TLS_CA");
  setenv("DIST_TOKEN", RO_TOKEN, 1); /* the harness polls Info */
  harness h;
  const char *const args[] = {"--auth-tokens-file", cert_path("tokens"), NULL};
  start_cluster(&h, 1, NULL, args, 1);
  dist_daemon_info info;

  dist_client *none = client_with_token(&h, ""); /* "" overrides DIST_TOKEN */
  cr_assert_eq(dist_health(none, 0), 0, "the health check must stay open");
  cr_assert_eq(dist_info(none, 0, &info), DIST_EAUTH, "%s", dist_errmsg(none));
  cr_assert(strstr(dist_errmsg(none), "bearer token"), "%s", dist_errmsg(none));
  dist_close(none);

  dist_client *bad = client_with_token(&h, "not-a-known-token-at-all");
  cr_assert_eq(dist_info(bad, 0, &info), DIST_EAUTH, "%s", dist_errmsg(bad));
  dist_close(bad);

  dist_client *ro = client_with_token(&h, RO_TOKEN);
  cr_assert_eq(dist_info(ro, 0, &info), 0, "%s", dist_errmsg(ro));
  dist_info_free(&info);
  cr_assert_eq(put_small(ro, "x"), DIST_EPERM, "%s", dist_errmsg(ro));
  cr_assert(strstr(dist_errmsg(ro), "read-write token"), "%s", dist_errmsg(ro));
  dist_close(ro);

  dist_client *rw = client_with_token(&h, RW_TOKEN);
  cr_assert_eq(put_small(rw, "x"), 0, "%s", dist_errmsg(rw));
  dist_close(rw);

  char *metrics = harness_metrics(&h, 0);
  cr_assert(strstr(metrics, "distd_auth_rejected_total{reason=\"missing_token\"} 1"), "%s",
            metrics);
  cr_assert(strstr(metrics, "distd_auth_rejected_total{reason=\"unknown_token\"} 1"), "%s",
            metrics);
  cr_assert(strstr(metrics, "distd_auth_rejected_total{reason=\"read_only_token\"} 1"), "%s",
            metrics);
  free(metrics);
  harness_stop(&h);
  remove_certs();
}

/* Writes the tokens file at path (mode 0600) with text. */
static void write_tokens(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  cr_assert(f, "%s", path);
  fputs(text, f);
  fclose(f);
  cr_assert_eq(chmod(path, 0600), 0);
}

/* Whether a client with token may call Info now. */
static int token_works(harness *h, const char *token) {
  dist_client *c = client_with_token(h, token);
  dist_daemon_info info;
  int rc = dist_info(c, 0, &info);
  if (rc == 0) dist_info_free(&info);
  dist_close(c);
  return rc == 0;
}

#define NEW_TOKEN "rotated-token-00112233445566"

/* SIGHUP reads the tokens file again: a rotated token replaces the old
 * one; a file that does not parse leaves the tokens in use, and the log
 * says why. */
Test(security, sighup_rotates_tokens_and_a_bad_file_keeps_them) {
  make_certs();
  unsetenv("DIST_TLS_CA");
  setenv("DIST_TOKEN", RW_TOKEN, 1); /* the harness polls Info */
  const char *path = cert_path("rotating-tokens");
  write_tokens(path, RW_TOKEN " read-write\n");
  harness h;
  const char *const args[] = {"--auth-tokens-file", path, NULL};
  start_cluster(&h, 1, NULL, args, 1);
  cr_assert(token_works(&h, RW_TOKEN));
  cr_assert(!token_works(&h, NEW_TOKEN));

  write_tokens(path, "# rotated\n" NEW_TOKEN " read-write\n");
  long from = harness_log_size(&h, 0);
  cr_assert_eq(kill(h.pids[0], SIGHUP), 0);
  const char *const reloaded[] = {"reloaded 1 bearer tokens from", NULL};
  cr_assert(harness_log_wait(&h, 0, from, reloaded, 10000), "no reload logged (%s)", h.dir);
  cr_assert(token_works(&h, NEW_TOKEN), "the rotated token is refused");
  cr_assert(!token_works(&h, RW_TOKEN), "the old token still works");

  write_tokens(path, NEW_TOKEN " admin\n");
  from = harness_log_size(&h, 0);
  cr_assert_eq(kill(h.pids[0], SIGHUP), 0);
  const char *const kept[] = {"the tokens in use stay", "rotating-tokens:1", "admin", NULL};
  cr_assert(harness_log_wait(&h, 0, from, kept, 10000), "no refusal logged (%s)", h.dir);
  cr_assert(token_works(&h, NEW_TOKEN), "a bad file dropped the tokens in use");
  harness_stop(&h);
  remove_certs();
}

/* Runs a shell command in the certificates' directory; fails the test if
 * it fails. */
static void in_certs(const char *cmd) {
  char line[1200];
  snprintf(line, sizeof line, "cd '%s' && %s", certs, cmd);
  char *err = NULL;
  int rc = harness_run(line, NULL, &err, 60);
  cr_assert_eq(rc, 0, "%s: %s", cmd, err ? err : "");
  free(err);
}

/* Whether a new client that trusts only the CA at ca_path gets Info from
 * rank r: a new connection, so a new handshake. */
static int trusted_with(harness *h, int r, const char *ca_path) {
  setenv("DIST_TLS_CA", ca_path, 1);
  dist_client *c = harness_client_rank(h, r, 2000);
  dist_daemon_info info;
  int rc = dist_info(c, 0, &info);
  if (rc == 0) dist_info_free(&info);
  dist_close(c);
  return rc == 0;
}

/* SIGHUP reads the certificates again. After a rotation to a new CA, new
 * gRPC connections get the new certificate; a daemon restarted with its
 * new one rejoins the reloaded peer over the data plane (which, without
 * the reload, would still trust the old CA only); a key that is not the
 * certificate's leaves the certificates in use. */
Test(security, sighup_rotates_certificates_and_a_bad_key_keeps_them) {
  make_certs();
  unsetenv("DIST_TLS_CERT");
  unsetenv("DIST_TLS_KEY");
  unsetenv("DIST_TOKEN");
  in_certs("mkdir ca2 && sh gen.sh ca2 && cp ca.crt ca1.crt && for r in 0 1; do "
           "cp rank$r.crt live$r.crt && cp rank$r.key live$r.key; done");
  const char *ca1 = cert_path("ca1.crt"), *ca2 = cert_path("ca2/ca.crt");
  setenv("DIST_TLS_CA", ca1, 1);
  harness h;
  const char *const live[] = {"live0", "live1"};
  start_cluster(&h, 2, live, NULL, 1);
  cr_assert(trusted_with(&h, 0, ca1), "the first certificate is refused");
  cr_assert(!trusted_with(&h, 0, ca2), "a client of the new CA got in before the rotation");

  in_certs("for r in 0 1; do cp ca2/rank$r.crt live$r.crt && cp ca2/rank$r.key "
           "live$r.key; done && cp ca2/ca.crt ca.crt");
  long from = harness_log_size(&h, 0);
  cr_assert_eq(kill(h.pids[0], SIGHUP), 0);
  const char *const reloaded[] = {"reloaded TLS certificate", "live0.crt", NULL};
  cr_assert(harness_log_wait(&h, 0, from, reloaded, 10000), "no reload logged (%s)", h.dir);
  cr_assert(trusted_with(&h, 0, ca2), "a new connection did not get the new certificate");
  cr_assert(!trusted_with(&h, 0, ca1), "a new connection still got the old certificate");

  harness_kill(&h, 1, SIGKILL);
  start_rank(&h, 1, "live1", NULL);
  setenv("DIST_TLS_CA", ca2, 1);
  harness_assert_all_connected(&h, "over TLS with the new CA after rank 1 restarted");
  dist_client *c = harness_client(&h);
  move_tensor(c);
  dist_close(c);

  in_certs("cp ca2/rank1.key live0.key");
  from = harness_log_size(&h, 0);
  cr_assert_eq(kill(h.pids[0], SIGHUP), 0);
  const char *const kept[] = {"the certificates in use stay",
                              "tls_key does not match tls_cert", NULL};
  cr_assert(harness_log_wait(&h, 0, from, kept, 10000), "no refusal logged (%s)", h.dir);
  cr_assert(trusted_with(&h, 0, ca2), "a bad key dropped the certificates in use");
  harness_stop(&h);
  remove_certs();
}

/* Revokes the certificate NAME.crt in the CA's database and writes the
 * CA's new CRL to OUT (in certs). */
static void revoke_cert(const char *name, const char *out) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "openssl ca -config ca.cnf -keyfile ca.key -cert ca.crt "
           "-revoke %s.crt 2>/dev/null && openssl ca -config ca.cnf -keyfile ca.key "
           "-cert ca.crt -gencrl -out %s.tmp 2>/dev/null && mv %s.tmp %s", name, out, out, out);
  in_certs(cmd);
}

/* The CA's CRL as its database stands, to OUT (in certs). */
static void write_crl(const char *out) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "openssl ca -config ca.cnf -keyfile ca.key -cert ca.crt -gencrl "
           "-out %s 2>/dev/null", out);
  in_certs(cmd);
}

/* Info from rank 0 with the client certificate NAME; its error, "" when
 * it was served. */
static int info_as(harness *h, const char *name, char *err, size_t len) {
  char crt[64], key[64];
  snprintf(crt, sizeof crt, "%s.crt", name);
  snprintf(key, sizeof key, "%s.key", name);
  setenv("DIST_TLS_CERT", cert_path(crt), 1);
  setenv("DIST_TLS_KEY", cert_path(key), 1);
  dist_client *c = harness_client_rank(h, 0, 2000);
  dist_daemon_info info;
  int rc = dist_info(c, 0, &info);
  if (rc == 0) dist_info_free(&info);
  snprintf(err, len, "%s", rc ? dist_errmsg(c) : "");
  dist_close(c);
  return rc;
}

/* tls_crl on the gRPC port: a revoked client certificate is refused with
 * its name, another one served; after SIGHUP the new CRL refuses calls on
 * connections made before it too. */
Test(security, revoked_client_certificates_are_refused_and_reloaded) {
  make_certs();
  use_tls_env();
  revoke_cert("client2", "live.crl");
  harness h;
  const char *const certs_of[] = {"rank0"};
  const char *const args[] = {"--tls-client-auth", "require", "--tls-crl",
                              cert_path("live.crl"), NULL};
  setenv("DIST_TLS_CERT", cert_path("client.crt"), 1); /* the harness polls */
  setenv("DIST_TLS_KEY", cert_path("client.key"), 1);
  start_cluster(&h, 1, certs_of, args, 1);
  char err[600];
  cr_assert_eq(info_as(&h, "client", err, sizeof err), 0, "%s", err);
  cr_assert_eq(info_as(&h, "client2", err, sizeof err), DIST_EAUTH, "%s", err);
  cr_assert(strstr(err, "the certificate /CN=client2 is revoked (tls_crl)"), "%s", err);

  setenv("DIST_TLS_CERT", cert_path("client.crt"), 1);
  setenv("DIST_TLS_KEY", cert_path("client.key"), 1);
  dist_client *open = harness_client_rank(&h, 0, 2000);
  dist_daemon_info info;
  cr_assert_eq(dist_info(open, 0, &info), 0, "%s", dist_errmsg(open));
  dist_info_free(&info);
  revoke_cert("client", "live.crl");
  long from = harness_log_size(&h, 0);
  cr_assert_eq(kill(h.pids[0], SIGHUP), 0);
  const char *const reloaded[] = {"reloaded TLS certificate", NULL};
  cr_assert(harness_log_wait(&h, 0, from, reloaded, 10000), "no reload logged (%s)", h.dir);
  cr_assert_eq(dist_info(open, 0, &info), DIST_EAUTH, "an open connection kept working");
  cr_assert(strstr(dist_errmsg(open), "/CN=client is revoked"), "%s", dist_errmsg(open));
  dist_close(open);
  harness_stop(&h);
  remove_certs();
}

/* tls_crl on the data plane: a daemon whose certificate is revoked cannot
 * join its peers, and the reason is logged. */
Test(security, a_daemon_with_a_revoked_certificate_cannot_join) {
  make_certs();
  use_tls_env();
  revoke_cert("rank1", "ca.crl");
  harness h;
  const char *const certs_of[] = {"rank0", "rank1"};
  const char *const args[] = {"--tls-crl", cert_path("ca.crl"), NULL};
  start_cluster(&h, 2, certs_of, args, 0);
  wait_serving(&h, 0);
  const char *const why[] = {"certificate revoked", NULL};
  cr_assert(harness_log_wait(&h, 0, 0, why, 10000),
            "rank 0 did not log rank 1's revoked certificate (%s)", h.dir);
  dist_client *c = harness_client_rank(&h, 0, 2000);
  dist_daemon_info info;
  cr_assert_eq(dist_info(c, 0, &info), 0, "%s", dist_errmsg(c));
  for (int i = 0; i < info.npeers; i++)
    cr_assert(info.peers[i].rank != 1 || !info.peers[i].connected,
              "rank 1 got in with a revoked certificate");
  dist_info_free(&info);
  dist_close(c);
  harness_stop(&h);
  remove_certs();
}

/* Waits, 10 s at most, for a line of rank r's log from byte `from` on
 * that holds "peer rank PEER (ITS ADDRESS)" then tail. */
static void expect_peer_logged(harness *h, int r, long from, int peer, const char *tail) {
  char line[300];
  snprintf(line, sizeof line, "peer rank %d (127.0.0.1:%d)%s", peer, h->peer_port[peer], tail);
  const char *const needles[] = {line, NULL};
  cr_assert(harness_log_wait(h, r, from, needles, 10000), "rank %d did not log '%s' (%s)", r,
            line, h->dir);
}

/* A CRL reloaded on SIGHUP reaches the open data-plane connections: ranks
 * 0 and 2 close rank 1's once its certificate is revoked. An all_reduce
 * of rank 0 waiting for rank 1 fails at once (well before peer_timeout),
 * naming rank 1 and the revocation, as does an operation started later;
 * ranks 0 and 2 go on working together. */
Test(security, a_crl_reload_closes_a_revoked_peers_open_connections) {
  make_certs();
  use_tls_env();
  write_crl("live.crl");
  harness h;
  const char *const certs_of[] = {"rank0", "rank1", "rank2"};
  const char *const args[] = {"--tls-crl", cert_path("live.crl"), "--peer-timeout", "60s",
                              NULL};
  start_cluster(&h, 3, certs_of, args, 1);
  const int all[] = {0, 1, 2}, pair[] = {0, 1}, others[] = {0, 2};
  harness_expect_all_reduce(&h, all, 3, "crl-before", "before the revocation");
  /* Rank 1's trainer never comes: rank 0 waits for its part. */
  harness_reduce waiting;
  harness_reduce_start(&waiting, &h, 0, pair, 2, "crl-waiting");
  harness_sleep_ms(500); /* in flight by then, usually; started later, it fails alike */

  revoke_cert("rank1", "live.crl");
  long from[3] = {harness_log_size(&h, 0), 0, harness_log_size(&h, 2)};
  cr_assert_eq(kill(h.pids[0], SIGHUP), 0);
  cr_assert_eq(kill(h.pids[2], SIGHUP), 0);
  int *done[] = {&waiting.done};
  cr_assert(harness_wait_all_positive(done, 1, 10000),
            "rank 0's all_reduce with revoked rank 1 still waits 10 s after the reload (%s)",
            h.dir);
  cr_assert_eq(harness_reduce_join(&waiting), DIST_EPEER, "%d: %s", waiting.rc, waiting.msg);
  cr_assert(strstr(waiting.msg, "peer rank 1 (") &&
            strstr(waiting.msg, "closed: its certificate /CN=rank1 is revoked (tls_crl reloaded)"),
            "%s", waiting.msg);

  for (int r = 0; r < 3; r += 2)
    expect_peer_logged(&h, r, from[r], 1,
                       ": closed: its certificate /CN=rank1 is revoked (tls_crl reloaded)");
  const char *const told[] = {"rank 0 closed our connection: our certificate /CN=rank1 is "
                              "revoked (its tls_crl reloaded)", NULL};
  cr_assert(harness_log_wait(&h, 1, 0, told, 10000), "rank 1 did not log why rank 0 closed "
            "its connections (%s)", h.dir);
  char *metrics = harness_metrics(&h, 0);
  cr_expect(strstr(metrics, "distd_peer_tls_revoked_closures_total{peer=\"1\"} ") &&
                !strstr(metrics, "distd_peer_tls_revoked_closures_total{peer=\"1\"} 0\n") &&
                strstr(metrics, "distd_peer_tls_revoked_closures_total{peer=\"2\"} 0\n"),
            "rank 0 does not count the closures of revoked rank 1 alone:\n%s", metrics);
  free(metrics);
  dist_client *c = harness_client(&h);
  float v[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  dist_tensor *t = NULL;
  int rc = harness_try_put(c, "w", DIST_FLOAT32, v, 1, shape, "[0,1]", "Shard(0)", &t);
  cr_assert_neq(rc, 0, "a put on revoked rank 1 went through");
  cr_assert(strstr(dist_errmsg(c), "peer rank 1 (") && strstr(dist_errmsg(c), "is revoked"),
            "%s", dist_errmsg(c));
  dist_tensor_free(harness_put(c, "w", DIST_FLOAT32, v, 1, shape, "[0,2]", "Shard(0)"));
  harness_expect_value(c, "w", v, sizeof v);
  dist_close(c);
  harness_expect_all_reduce(&h, others, 2, "crl-after", "after the revocation");
  harness_stop(&h);
  remove_certs();
}

/* A second CA, /CN=distd-test-ca2, and rank1b: rank 1's key certified by
 * it (no single quotes: harness_run quotes the command with them). ca.crt becomes a bundle of both CAs (every rank's tls_ca, and the
 * clients'), ca1.crt the first CA alone. */
static const char second_ca_script[] =
    "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca2.key "
    "-out ca2.crt -days 2 -subj /CN=distd-test-ca2 -addext basicConstraints=critical,CA:TRUE "
    "-addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null && "
    "openssl req -new -key rank1.key -subj /CN=rank1 -out rank1b.csr 2>/dev/null && "
    "printf \"subjectAltName=DNS:distd-rank-1,DNS:localhost,IP:127.0.0.1\\n"
    "extendedKeyUsage=serverAuth,clientAuth\\nkeyUsage=critical,digitalSignature\\n\" "
    "> rank1b.ext && openssl x509 -req -in rank1b.csr -CA ca2.crt -CAkey ca2.key "
    "-CAcreateserial -out rank1b.crt -days 2 -extfile rank1b.ext 2>/dev/null && "
    "cp rank1.key rank1b.key && cp ca.crt ca1.crt && cat ca1.crt ca2.crt > ca.crt";

/* Three ranks whose tls_ca trusts both CAs, rank 1 certified by the
 * second; an all_reduce of all three works. */
static void start_with_rank1_of_ca2(harness *h) {
  make_certs();
  in_certs(second_ca_script);
  use_tls_env();
  const char *const certs_of[] = {"rank0", "rank1b", "rank2"};
  const char *const args[] = {"--peer-timeout", "60s", NULL};
  start_cluster(h, 3, certs_of, args, 1);
  const int all[] = {0, 1, 2};
  harness_expect_all_reduce(h, all, 3, "ca-before", "before the CA was dropped");
}

/* Rank 0 reloads a tls_ca without the second CA, while `waiting` (an
 * all_reduce of ranks 0 and 1 at one of them, whose partner never comes)
 * is in flight; it must end within 10 s, failing with DIST_EPEER. */
static void drop_ca2_at_rank0(harness *h, harness_reduce *waiting) {
  harness_sleep_ms(500); /* in flight by then, usually; started later, it fails alike */
  in_certs("cp ca1.crt ca.crt.tmp && mv ca.crt.tmp ca.crt");
  cr_assert_eq(kill(h->pids[0], SIGHUP), 0);
  int *done[] = {&waiting->done};
  cr_assert(harness_wait_all_positive(done, 1, 10000),
            "rank %d's all_reduce over ranks 0 and 1 still waits 10 s after rank 0 dropped "
            "rank 1's CA (%s)", waiting->rank, h->dir);
  cr_assert_eq(harness_reduce_join(waiting), DIST_EPEER, "%d: %s", waiting->rc, waiting->msg);
}

/* A CA dropped from tls_ca by a reload reaches the open data-plane
 * connections: rank 0 closes those of rank 1, whose certificate that CA
 * signed. Its all_reduce waiting for rank 1 fails at once, naming rank 1
 * and why; the closures are counted apart from revocations; ranks 0 and 2
 * go on working together. */
Test(security, a_ca_dropped_from_tls_ca_closes_its_peers_open_connections) {
  harness h;
  start_with_rank1_of_ca2(&h);
  const int pair[] = {0, 1}, others[] = {0, 2};
  harness_reduce waiting;
  harness_reduce_start(&waiting, &h, 0, pair, 2, "ca-waiting");
  long from = harness_log_size(&h, 0);
  drop_ca2_at_rank0(&h, &waiting);
  const char *why = ": closed: its certificate /CN=rank1 is no longer trusted: ";
  cr_assert(strstr(waiting.msg, "peer rank 1 (") && strstr(waiting.msg, why) &&
                strstr(waiting.msg, "(tls_ca/tls_crl reloaded)"),
            "%s", waiting.msg);
  expect_peer_logged(&h, 0, from, 1, why);
  char *metrics = harness_metrics(&h, 0);
  cr_expect(strstr(metrics, "distd_peer_tls_untrusted_closures_total{peer=\"1\"} ") &&
                !strstr(metrics, "distd_peer_tls_untrusted_closures_total{peer=\"1\"} 0\n") &&
                strstr(metrics, "distd_peer_tls_untrusted_closures_total{peer=\"2\"} 0\n") &&
                strstr(metrics, "distd_peer_tls_revoked_closures_total{peer=\"1\"} 0\n"),
            "rank 0 does not count the closures of untrusted rank 1 alone:\n%s", metrics);
  free(metrics);
  harness_expect_all_reduce(&h, others, 2, "ca-after", "after the CA was dropped");
  harness_stop(&h);
  remove_certs();
}

/* The daemon whose connections are closed for its certificate is told
 * why: rank 1's all_reduce waiting for rank 0 fails at once naming rank
 * 0's reason, as does its log; and its redials, which rank 0 refuses at
 * the handshake, keep to the backoff instead of flooding the log. */
Test(security, a_peer_closed_for_its_certificate_is_told_why) {
  harness h;
  start_with_rank1_of_ca2(&h);
  const int pair[] = {0, 1};
  harness_reduce waiting;
  harness_reduce_start(&waiting, &h, 1, pair, 2, "told-waiting");
  long from = harness_log_size(&h, 1);
  drop_ca2_at_rank0(&h, &waiting);
  const char *why = " lost: rank 0 closed our connection: our certificate /CN=rank1 is no "
                    "longer trusted: ";
  cr_assert(strstr(waiting.msg, why) && strstr(waiting.msg, "(its tls_ca/tls_crl reloaded)"),
            "%s", waiting.msg);
  expect_peer_logged(&h, 1, from, 0, why);
  /* Redials back off from connect_backoff_min (50 ms) doubling: about six
   * tries each way in 3 s. A tight loop would log thousands of lines. */
  long told_at = harness_log_size(&h, 1);
  harness_sleep_ms(3000);
  long grown = harness_log_size(&h, 1) - told_at;
  cr_expect_lt(grown, 8000, "rank 1 logged %ld bytes in 3 s after the closure (%s)", grown,
               h.dir);
  harness_stop(&h);
  remove_certs();
}

/* tls_crl in a client: a daemon whose certificate the CRL revokes is
 * refused, naming it, while the other daemon is served; distctl takes it
 * as --tls-crl. A CRL without a CA, or of another CA, is refused at
 * connect. */
Test(security, a_client_refuses_a_daemon_with_a_revoked_certificate) {
  make_certs();
  use_tls_env();
  revoke_cert("rank1", "ca.crl");
  harness h;
  const char *const certs_of[] = {"rank0", "rank1"};
  start_cluster(&h, 2, certs_of, NULL, 1); /* the daemons check no CRL */
  setenv("DIST_TLS_CRL", cert_path("ca.crl"), 1);
  dist_client *c = harness_client(&h);
  dist_daemon_info info;
  cr_assert_eq(dist_info(c, 0, &info), 0, "%s", dist_errmsg(c));
  dist_info_free(&info);
  cr_assert_eq(dist_info(c, 1, &info), DIST_EAUTH, "%s", dist_errmsg(c));
  char want[200];
  snprintf(want, sizeof want, "distd at 127.0.0.1:%d is refused: the certificate /CN=rank1 "
           "is revoked (tls_crl)", h.grpc_port[1]);
  cr_assert(strstr(dist_errmsg(c), want), "%s", dist_errmsg(c));
  dist_close(c);

  unsetenv("DIST_TLS_CRL");
  char cmd[1200], *out = NULL, *err = NULL;
  snprintf(cmd, sizeof cmd, "%s --cluster %s --tls-crl %s status", harness_distctl(),
           h.cluster_file, cert_path("ca.crl"));
  harness_run(cmd, &out, &err, 30);
  cr_assert(strstr(out, "/CN=rank1 is revoked (tls_crl)") || strstr(err, "/CN=rank1 is revoked"),
            "distctl did not name the revoked daemon: %s / %s", out, err);
  free(out), free(err);

  unsetenv("DIST_TLS_CA");
  dist_opts o = DIST_OPTS_INIT;
  o.tls_crl = cert_path("ca.crl");
  c = NULL;
  cr_assert_eq(dist_connect_cluster(h.cluster_file, &o, &c), DIST_ECONFIG);
  cr_assert(strstr(dist_last_connect_error(), "tls_crl needs a CA too"), "%s",
            dist_last_connect_error());
  in_certs("mkdir ca2 && sh gen.sh ca2");
  o.tls_ca = cert_path("ca2/ca.crt");
  cr_assert_eq(dist_connect_cluster(h.cluster_file, &o, &c), DIST_ECONFIG);
  cr_assert(strstr(dist_last_connect_error(), "is not signed by a certificate in tls_ca"), "%s",
            dist_last_connect_error());
  harness_stop(&h);
  remove_certs();
}

/* A client reads its CRL file again at a handshake when the file changed:
 * a daemon revoked while the client runs is refused once the client
 * reconnects to it (here, after the daemon restarts). */
Test(security, a_client_takes_a_new_crl_when_it_reconnects) {
  make_certs();
  use_tls_env();
  write_crl("live.crl");
  harness h;
  const char *const certs_of[] = {"rank0", "rank1"};
  start_cluster(&h, 2, certs_of, NULL, 1);
  setenv("DIST_TLS_CRL", cert_path("live.crl"), 1);
  dist_client *c = harness_client(&h);
  unsetenv("DIST_TLS_CRL"); /* the harness's own clients check none */
  dist_daemon_info info;
  cr_assert_eq(dist_info(c, 0, &info), 0, "%s", dist_errmsg(c));
  dist_info_free(&info);

  revoke_cert("rank0", "live.crl");
  cr_assert_neq(harness_kill(&h, 0, SIGKILL), -1);
  start_rank(&h, 0, "rank0", NULL);
  wait_serving(&h, 0);
  int rc = 0;
  for (int waited = 0; waited < 20000; waited += 100) { /* gRPC's reconnect backoff */
    if ((rc = dist_info(c, 0, &info)) == 0) dist_info_free(&info);
    if (rc == DIST_EAUTH) break;
    harness_sleep_ms(100);
  }
  cr_assert_eq(rc, DIST_EAUTH, "the new CRL was not taken: %s", dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "the certificate /CN=rank0 is revoked (tls_crl)"), "%s",
            dist_errmsg(c));
  cr_assert_eq(dist_info(c, 1, &info), 0, "%s", dist_errmsg(c));
  dist_info_free(&info);
  dist_close(c);
  harness_stop(&h);
  remove_certs();
}

/* The date openssl prints for a file (`openssl CMD -noout -in FILE` with
 * FIELD=... on its output), in seconds since the epoch, by date(1). */
static long long openssl_date(const char *cmd, const char *file) {
  char line[700], *out = NULL;
  snprintf(line, sizeof line, "cd '%s' && date -d \"$(openssl %s -noout -in %s | cut -d= -f2)\" "
           "+%%s", certs, cmd, file);
  cr_assert_eq(harness_run(line, &out, NULL, 30), 0, "%s", line);
  long long t = atoll(out);
  free(out);
  cr_assert_gt(t, 0, "%s", line);
  return t;
}

/* /metrics gives the certificate's expiry and the CRL's next update, as
 * openssl reads them from the files; a CRL due within a day and a
 * certificate within a week are warned of in the log. */
Test(security, certificate_and_crl_dates_are_in_metrics_and_warned_of) {
  make_certs();
  use_tls_env();
  in_certs("openssl ca -config ca.cnf -keyfile ca.key -cert ca.crt -gencrl -crlhours 5 "
           "-out soon.crl 2>/dev/null");
  harness h;
  const char *const certs_of[] = {"rank0"};
  const char *const args[] = {"--tls-crl", cert_path("soon.crl"), NULL};
  start_cluster(&h, 1, certs_of, args, 1);
  char *metrics = harness_metrics(&h, 0);
  char want[200];
  snprintf(want, sizeof want, "distd_tls_certificate_expiry_timestamp_seconds %lld\n",
           openssl_date("x509 -enddate", "rank0.crt"));
  cr_assert(strstr(metrics, want), "no '%s' in %s", want, metrics);
  snprintf(want, sizeof want, "distd_tls_crl_next_update_timestamp_seconds %lld\n",
           openssl_date("crl -nextupdate", "soon.crl"));
  cr_assert(strstr(metrics, want), "no '%s' in %s", want, metrics);
  free(metrics);
  const char *const crl_soon[] = {"its next update is in 5.0 h", NULL};
  cr_assert(harness_log_wait(&h, 0, 0, crl_soon, 5000), "no CRL warning (%s)", h.dir);
  const char *const cert_soon[] = {"expires in 2.0 days: rotate it and reload", NULL};
  cr_assert(harness_log_wait(&h, 0, 0, cert_soon, 5000), "no certificate warning (%s)", h.dir);
  harness_stop(&h);
  remove_certs();
}

/* A CRL that tls_ca did not sign, or tls_crl without TLS, stops the daemon
 * at start, naming what is wrong. */
Test(security, a_crl_of_another_ca_or_without_tls_stops_the_daemon) {
  make_certs();
  in_certs("mkdir ca2 && sh gen.sh ca2 && cd ca2 && openssl ca -config ca.cnf -keyfile "
           "ca.key -cert ca.crt -gencrl -out ca.crl 2>/dev/null");
  struct { const char *tls, *want; } cases[] = {
      {"--tls-cert %s/rank0.crt --tls-key %s/rank0.key --tls-ca %s/ca.crt",
       "the CRL of /CN=distd-test-ca is not signed by a certificate in tls_ca"},
      {"", "tls_crl needs TLS and a CA"}};
  for (int i = 0; i < 2; i++) {
    char tls[900], cmd[1600], *err = NULL;
    snprintf(tls, sizeof tls, cases[i].tls, certs, certs, certs);
    int port = harness_free_port(), peer_port = harness_free_port();
    snprintf(cmd, sizeof cmd, "%s --listen 127.0.0.1:%d --http-listen off --peers "
             "\"127.0.0.1:%d 127.0.0.1:%d\" %s --tls-crl %s", harness_distd(), port, port,
             peer_port, tls, cert_path("ca2/ca.crl"));
    cr_assert_eq(harness_run(cmd, NULL, &err, 10), 1, "case %d: %s", i, err);
    cr_assert(strstr(err, cases[i].want), "case %d: %s", i, err);
    free(err);
  }
  remove_certs();
}

/* The daemon and libdist read their TLS files with one reader
 * (dist_read_pem): a file that is missing or holds no PEM is refused,
 * naming the setting, the file and why. */
Test(security, a_tls_file_that_cannot_be_used_is_named_with_why) {
  make_certs();
  char want[700], tls[900];
  struct { const char *ca, *crl, *why; } cases[] = {
      {"tokens", "", "tls_ca %s/tokens: not a PEM file"},
      {"ca.crt", "--tls-crl %s/missing.crl", "tls_crl %s/missing.crl: No such file"}};
  for (int i = 0; i < 2; i++) {
    char crl[400], cmd[1600], *err = NULL;
    snprintf(crl, sizeof crl, cases[i].crl, certs);
    snprintf(tls, sizeof tls, "--tls-cert %s --tls-key %s --tls-ca %s %s",
             cert_path("rank0.crt"), cert_path("rank0.key"), cert_path(cases[i].ca), crl);
    int port = harness_free_port(), peer_port = harness_free_port();
    snprintf(cmd, sizeof cmd, "%s --listen 127.0.0.1:%d --http-listen off --peers "
             "\"127.0.0.1:%d 127.0.0.1:%d\" %s", harness_distd(), port, port, peer_port, tls);
    cr_assert_eq(harness_run(cmd, NULL, &err, 10), 1, "case %d: %s", i, err);
    snprintf(want, sizeof want, cases[i].why, certs);
    cr_assert(strstr(err, want), "case %d: no '%s' in %s", i, want, err);
    free(err);
  }
  dist_opts o = DIST_OPTS_INIT;
  o.tls_ca = cert_path("tokens");
  dist_client *c = NULL;
  cr_assert_eq(dist_connect("127.0.0.1:1", &o, &c), DIST_ECONFIG);
  snprintf(want, sizeof want, "tls_ca %s/tokens: not a PEM file", certs);
  cr_assert(strstr(dist_last_connect_error(), want), "%s", dist_last_connect_error());
  o.tls_ca = cert_path("ca.crt");
  o.tls_crl = cert_path("missing.crl");
  cr_assert_eq(dist_connect("127.0.0.1:1", &o, &c), DIST_ECONFIG);
  snprintf(want, sizeof want, "tls_crl %s/missing.crl: No such file", certs);
  cr_assert(strstr(dist_last_connect_error(), want), "%s", dist_last_connect_error());
  remove_certs();
}

/* A key that is not the certificate's stops the daemon at start, naming
 * the key, whether the gRPC port checks it (data plane plain) or both. */
Test(security, key_of_another_certificate_stops_the_daemon_at_start) {
  make_certs();
  const char *const peer_tls[] = {"off", "on"};
  for (int i = 0; i < 2; i++) {
    char cmd[1400], *err = NULL;
    int port = harness_free_port(), peer_port = harness_free_port();
    snprintf(cmd, sizeof cmd, "%s --listen 127.0.0.1:%d --http-listen off --peers "
             "\"127.0.0.1:%d 127.0.0.1:%d\" --tls-cert %s --tls-key %s --tls-ca %s "
             "--peer-tls %s", harness_distd(), port, port, peer_port,
             cert_path("rank0.crt"), cert_path("rank1.key"), cert_path("ca.crt"),
             peer_tls[i]);
    cr_assert_eq(harness_run(cmd, NULL, &err, 10), 1, "peer_tls %s: %s", peer_tls[i], err);
    cr_assert(strstr(err, "tls_key does not match tls_cert") && strstr(err, "rank1.key"),
              "peer_tls %s: %s", peer_tls[i], err);
    free(err);
  }
  remove_certs();
}

Test(security, tensor_bytes_limit_names_itself) {
  unsetenv("DIST_TLS_CA");
  unsetenv("DIST_TOKEN");
  harness h;
  const char *const args[] = {"--max-tensor-bytes", "1K", NULL};
  harness_start(&h, 1, args);
  dist_client *c = harness_client_rank(&h, 0, 5000);
  cr_assert_eq(put_small(c, "small"), 0, "%s", dist_errmsg(c));
  float big[512] = {0};
  int64_t shape[1] = {512};
  dist_mesh *mesh = NULL;
  dist_mesh_from_string("[0]", NULL, &mesh);
  dist_placement rep = DIST_REPLICATED;
  dist_tensor *t = NULL;
  int rc = dist_shard_tensor(c, "big", big, DIST_FLOAT32, 1, shape, mesh, &rep, &t);
  cr_assert_eq(rc, DIST_ETOOBIG, "%d: %s", rc, dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "max_tensor_bytes (1024)"), "%s", dist_errmsg(c));
  dist_mesh_free(mesh);
  dist_close(c);
  harness_stop(&h);
}

typedef struct blocked_call {
  harness *h;
  int rc;
  atomic_int done;
  pthread_t th;
} blocked_call;

/* A trainer of rank 0 alone: its barrier waits for rank 1's, which never
 * comes, so the call stays in flight. */
static void *lonely_barrier(void *arg) {
  blocked_call *b = arg;
  dist_client *c = NULL;
  if (dist_init_from_env(&c) != 0) {
    b->rc = -100;
  } else {
    b->rc = dist_barrier(c);
    dist_close(c);
  }
  atomic_store(&b->done, 1);
  return NULL;
}

static void start_lonely_barrier(blocked_call *b) {
  atomic_store(&b->done, 0);
  pthread_create(&b->th, NULL, lonely_barrier, b);
}

Test(security, in_flight_limit_per_client) {
  unsetenv("DIST_TLS_CA");
  unsetenv("DIST_TOKEN");
  harness h;
  const char *const args[] = {"--max-inflight-per-client", "1", NULL};
  harness_start(&h, 2, args);
  setenv("DIST_CLUSTER", h.cluster_file, 1);
  setenv("DIST_RANK", "0", 1);
  setenv("DIST_WORLD_SIZE", "2", 1);
  blocked_call b = {.h = &h};
  start_lonely_barrier(&b);
  dist_client *c = harness_client_rank(&h, 0, 5000);
  int rc = 0;
  dist_daemon_info info;
  /* Until the barrier has reached the daemon, Info may still pass. The
   * barrier and Info count against the same limit, so a barrier that
   * arrives while an Info is in flight is refused: start it again. */
  for (int waited = 0; waited < 5000; waited += 50) {
    if (atomic_load(&b.done)) {
      pthread_join(b.th, NULL);
      cr_assert_eq(b.rc, DIST_ETOOBIG, "the barrier ended early: %d", b.rc);
      start_lonely_barrier(&b);
    }
    rc = dist_info(c, 0, &info);
    if (rc != 0) break;
    dist_info_free(&info);
    harness_sleep_ms(50);
  }
  cr_assert_eq(rc, DIST_ETOOBIG, "%d: %s", rc, dist_errmsg(c));
  cr_assert(strstr(dist_errmsg(c), "max_inflight_per_client (1)"), "%s", dist_errmsg(c));
  cr_assert_eq(dist_health(c, 0), 0, "health checks are not counted");
  dist_close(c);
  harness_stop(&h); /* cancels the barrier */
  pthread_join(b.th, NULL);
  cr_assert_neq(b.rc, 0, "a barrier without rank 1 cannot succeed");
}
