/* Connecting, errors, op ids. */
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "cluster.h"
#include "daemon_crl.h"
#include "fileio.h"
#include "hash.h"
#include "pbuf.h"
#include "random.h"

static __thread char connect_error[512];

const char *dist_last_connect_error(void) { return connect_error; }

static int connect_fail(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int connect_fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(connect_error, sizeof connect_error, fmt, ap);
  va_end(ap);
  return code;
}

int dist_client_vfail(dist_client *c, int code, const char *fmt, va_list ap) {
  c->err.code = code;
  vsnprintf(c->err.msg, sizeof c->err.msg, fmt, ap);
  return code;
}

int dist_client_fail(dist_client *c, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  dist_client_vfail(c, code, fmt, ap);
  va_end(ap);
  return code;
}

/* Why the last call given a NULL client failed: there is no client to
 * keep it in, so it is kept per thread, as connect's is. */
static __thread char no_client_error[512];

int dist_thread_fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(no_client_error, sizeof no_client_error, fmt, ap);
  va_end(ap);
  return code;
}

void dist_note_first_failure(const dist_client *c, int r, dist_errbuf *first) {
  if (!r || first->code) return;
  *first = c->err;
  first->code = r;
}

int dist_null_handle(const char *func, const char *arg) {
  return dist_thread_fail(DIST_EINVAL, "%s: %s is NULL", func, arg);
}

int dist_no_client(const char *func) { return dist_null_handle(func, "c"); }

int dist_client_null_arg(dist_client *c, const char *func, const char *arg) {
  return dist_client_fail(c, DIST_EINVAL, "%s: %s is NULL", func, arg);
}

int dist_client_check_trainer(dist_client *c, const char *func, int trainer) {
  if (trainer >= 0) return 0;
  return dist_client_fail(c, DIST_EINVAL, "%s: trainer %d is negative", func, trainer);
}

int dist_client_check_rank(dist_client *c, const char *func, int rank) {
  if (rank >= 0 && rank < c->n) return 0;
  return dist_client_fail(c, DIST_EINVAL, "%s: no daemon of rank %d (cluster of %d)", func,
                          rank, c->n);
}

/* An option, else its environment variable; "" means "not set" either way
 * (so a caller can turn off what the environment says). */
static const char *opt_or_env(const char *v, const char *env) {
  if (!v) v = getenv(env);
  return v && v[0] ? v : NULL;
}

/* The PEM file a TLS setting names; NULL with *rc set to the failure
 * when it cannot be used. Nothing is read once *rc is set, so the calls
 * can follow each other without checks. */
static char *pem_or_fail(const char *setting, const char *path, int *rc) {
  char *pem = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  if (*rc == 0 && dist_read_pem(setting, path, &pem, NULL, &eb) != 0)
    *rc = connect_fail(eb.code, "%s", dist_errbuf_msg(&eb));
  return pem;
}

/* What the TLS settings name, read once for every channel. ca NULL:
 * insecure. */
typedef struct {
  const char *ca_path;
  char *ca, *cert, *key; /* PEM */
  dist_daemon_crl *crl;  /* NULL without tls_crl */
} tls_settings;

static void tls_settings_free(tls_settings *t) {
  if (t->key) memset(t->key, 0, strlen(t->key));
  free(t->ca);
  free(t->cert);
  free(t->key);
  dist_daemon_crl_release(t->crl);
  memset(t, 0, sizeof *t);
}

/* TLS when a CA is given (opts or DIST_TLS_CA), with a client certificate
 * for mutual TLS when one is given too, and the daemons' certificates
 * checked against a CRL when tls_crl is; insecure otherwise. */
static int tls_settings_read(const dist_opts *o, int n, tls_settings *t) {
  const char *ca = opt_or_env(o->tls_ca, "DIST_TLS_CA");
  const char *cert = opt_or_env(o->tls_cert, "DIST_TLS_CERT");
  const char *key = opt_or_env(o->tls_key, "DIST_TLS_KEY");
  const char *crl = opt_or_env(o->tls_crl, "DIST_TLS_CRL");
  memset(t, 0, sizeof *t);
  if (!ca && (cert || key || crl))
    return connect_fail(DIST_ECONFIG, "%s needs a CA too (tls_ca / DIST_TLS_CA / --tls-ca)",
                        crl ? "tls_crl" : "a client certificate");
  if (!ca) return 0;
  if (!cert != !key)
    return connect_fail(DIST_ECONFIG, "tls_cert and tls_key go together: only %s is set",
                        cert ? "tls_cert" : "tls_key");
  int rc = 0;
  t->ca_path = ca;
  t->ca = pem_or_fail("tls_ca", ca, &rc);
  if (cert) t->cert = pem_or_fail("tls_cert", cert, &rc);
  if (key) t->key = pem_or_fail("tls_key", key, &rc);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  if (rc == 0 && crl && dist_daemon_crl_new(crl, t->ca, n, &t->crl, &eb) != 0)
    rc = connect_fail(eb.code, "%s", dist_errbuf_msg(&eb));
  if (rc != 0) tls_settings_free(t);
  return rc;
}

/* The credentials of the channel to rank's daemon: with tls_crl, each
 * channel's say whose certificate it checks (daemon_crl.h). */
static int channel_creds(const tls_settings *t, int rank, grpc_channel_credentials **out) {
  if (!t->ca) {
    *out = grpc_insecure_credentials_create();
    return 0;
  }
  grpc_ssl_pem_key_cert_pair pair = {t->key, t->cert};
  grpc_ssl_verify_peer_options verify = {0};
  if (t->crl && dist_daemon_crl_verify_options(t->crl, rank, &verify) != 0)
    return connect_fail(DIST_ENOMEM, "out of memory for the tls_crl check of channel %d",
                        rank);
  *out = grpc_ssl_credentials_create_ex(t->ca, t->cert ? &pair : NULL,
                                        t->crl ? &verify : NULL, NULL);
  if (*out) return 0;
  dist_daemon_crl_verify_options_free(&verify);
  return connect_fail(DIST_ECONFIG, "gRPC refused the TLS settings (CA %s)", t->ca_path);
}

static void set_token(dist_client *c, const dist_opts *o) {
  const char *token = opt_or_env(o->token, "DIST_TOKEN");
  if (!token) return;
  size_t n = strlen(token);
  char *value = malloc(n + 8);
  if (!value) return;
  memcpy(value, "Bearer ", 7);
  memcpy(value + 7, token, n + 1);
  c->auth_md.key = grpc_slice_from_static_string("authorization");
  c->auth_md.value = grpc_slice_from_copied_string(value);
  c->auth_md_count = 1;
  memset(value, 0, n + 7);
  free(value);
}

static grpc_channel *open_channel(const char *endpoint, grpc_channel_credentials *creds) {
  grpc_arg args[5];
  args[0].type = GRPC_ARG_INTEGER;
  args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  args[0].value.integer = -1; /* tensors can be large: the daemon limits */
  args[1].type = GRPC_ARG_INTEGER;
  args[1].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  args[1].value.integer = -1;
  /* One channel per daemon, not shared with other clients in the process. */
  args[2].type = GRPC_ARG_INTEGER;
  args[2].key = (char *)GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
  args[2].value.integer = 1;
  /* A daemon that is still starting should be found within a second, not
   * after gRPC's default reconnect backoff of up to two minutes. */
  args[3].type = GRPC_ARG_INTEGER;
  args[3].key = (char *)GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS;
  args[3].value.integer = 100;
  args[4].type = GRPC_ARG_INTEGER;
  args[4].key = (char *)GRPC_ARG_MAX_RECONNECT_BACKOFF_MS;
  args[4].value.integer = 1000;
  grpc_channel_args ca = {5, args};
  return grpc_channel_create(endpoint, creds, &ca);
}

/* The trainer's heap (dist.h, "Memory"): kept from the first client on,
 * unless DIST_KEEP_HEAP=0; what it holds goes back when the last client
 * closes. */
static pthread_once_t heap_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t heap_mu = PTHREAD_MUTEX_INITIALIZER;
static int heap_kept, open_clients;

static void keep_heap(void) {
  const char *v = getenv("DIST_KEEP_HEAP");
  if (v && strcmp(v, "0") == 0) return;
  dist_heap_keep();
  heap_kept = 1;
}

static void client_opened(void) {
  pthread_once(&heap_once, keep_heap);
  pthread_mutex_lock(&heap_mu);
  open_clients++;
  pthread_mutex_unlock(&heap_mu);
}

static void client_closed(void) {
  pthread_mutex_lock(&heap_mu);
  int last = --open_clients == 0;
  pthread_mutex_unlock(&heap_mu);
  if (last && heap_kept) malloc_trim(0);
}

/* Every channel's credentials, or none: one for all (*shared) unless the
 * channels check certificates against a CRL. */
static int all_creds(const tls_settings *t, int n, grpc_channel_credentials **creds,
                     int *shared) {
  *shared = t->crl == NULL;
  if (*shared) n = 1;
  for (int i = 0; i < n; i++) {
    int rc = channel_creds(t, i, &creds[i]);
    if (rc == 0) continue;
    while (i-- > 0) grpc_channel_credentials_release(creds[i]);
    return rc;
  }
  return 0;
}

static void release_creds(grpc_channel_credentials **creds, int n) {
  for (int i = 0; i < n; i++) grpc_channel_credentials_release(creds[i]);
  free(creds);
}

static int open_client(const dist_member *members, int n, const dist_opts *opts,
                       dist_client **out) {
  dist_opts defaults = DIST_OPTS_INIT;
  if (!opts) opts = &defaults;
  grpc_init();
  tls_settings tls;
  grpc_channel_credentials **creds = calloc((size_t)n, sizeof *creds);
  int rc = creds ? tls_settings_read(opts, n, &tls)
                 : connect_fail(DIST_ENOMEM, "out of memory for the credentials of %d "
                                "channel(s)", n);
  int shared = 0;
  if (rc == 0 && (rc = all_creds(&tls, n, creds, &shared)) != 0) tls_settings_free(&tls);
  if (rc != 0) {
    free(creds);
    grpc_shutdown();
    return rc;
  }
  dist_client *c = calloc(1, sizeof *c);
  if (c) {
    c->endpoints = calloc((size_t)n, sizeof *c->endpoints);
    c->channels = calloc((size_t)n, sizeof *c->channels);
  }
  if (!c || !c->endpoints || !c->channels) {
    release_creds(creds, shared ? 1 : n);
    tls_settings_free(&tls);
    if (c) free(c->endpoints), free(c->channels);
    free(c);
    grpc_shutdown();
    return connect_fail(DIST_ENOMEM, "out of memory for a client of %d daemon(s)", n);
  }
  c->n = n;
  c->daemon_crl = tls.crl; /* the client's reference */
  tls.crl = NULL;
  tls_settings_free(&tls);
  for (int i = 0; i < n; i++) {
    snprintf(c->endpoints[i], sizeof c->endpoints[i], "%s", members[i].grpc_addr);
    c->channels[i] = open_channel(members[i].grpc_addr, creds[shared ? 0 : i]);
    if (!shared) grpc_channel_credentials_release(creds[i]); /* the channel holds a ref */
  }
  if (shared) grpc_channel_credentials_release(creds[0]);
  free(creds);
  set_token(c, opts);
  c->spmd_rank = -1;
  atomic_init(&c->daemon_rank, -1);
  atomic_init(&c->unanswered_ms, 0);
  c->timeout_ms = opts->timeout_ms > 0 ? opts->timeout_ms : 30000;
  c->op_base = opts->op_id_base;
  /* single client: ids nobody else will pick */
  if (!c->op_base && dist_random_bytes(&c->op_base, sizeof c->op_base) != 0)
    c->op_base = (uint64_t)(uintptr_t)c;
  client_opened();
  *out = c;
  return 0;
}

int dist_connect(const char *endpoint, const dist_opts *opts, dist_client **out) {
  dist_member m;
  *out = NULL;
  if (!endpoint) endpoint = DIST_DEFAULT_ENDPOINT;
  if (!endpoint[0] || strlen(endpoint) >= sizeof m.grpc_addr)
    return connect_fail(DIST_EINVAL, "bad endpoint '%s'", endpoint);
  snprintf(m.grpc_addr, sizeof m.grpc_addr, "%s", endpoint);
  m.peer_addr[0] = 0;
  int rc = open_client(&m, 1, opts, out);
  if (rc == 0) (*out)->one_endpoint = 1;
  return rc;
}

int dist_connect_cluster(const char *path, const dist_opts *opts,
                         dist_client **out) {
  *out = NULL;
  if (!path) path = getenv("DIST_CLUSTER");
  if (!path || !path[0])
    return connect_fail(DIST_EINVAL, "no cluster file: pass one or set DIST_CLUSTER");
  dist_member *members = NULL;
  int n = 0;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  if (dist_cluster_load(path, &members, &n, &eb) != 0)
    return connect_fail(eb.code, "%s", dist_errbuf_msg(&eb));
  int rc = open_client(members, n, opts, out);
  free(members);
  return rc;
}

/* SPMD trainers of one launch share DIST_JOB_ID, so their op ids agree. */
static uint64_t job_op_base(void) {
  const char *job = getenv("DIST_JOB_ID");
  if (!job) job = "default";
  return dist_fnv1a(job, strlen(job));
}

/* dist_init_from_env refusing the client it connected: closed, *out
 * NULL, code returned (connect's error says why). */
static int init_refused(dist_client **out, int code) {
  dist_close(*out);
  *out = NULL;
  return code;
}

int dist_init_from_env(dist_client **out) {
  *out = NULL;
  const char *rank = getenv("DIST_RANK"), *world = getenv("DIST_WORLD_SIZE");
  if (!rank || !world)
    return connect_fail(DIST_EINVAL, "DIST_RANK and DIST_WORLD_SIZE must be set "
                        "(start trainers with `distctl launch`)");
  char *end;
  long r = strtol(rank, &end, 10), w = strtol(world, &end, 10);
  dist_opts o = DIST_OPTS_INIT;
  o.op_id_base = job_op_base();
  int rc = dist_connect_cluster(NULL, &o, out);
  if (rc != 0) return rc;
  if (r < 0 || w != (*out)->n || r >= w)
    return init_refused(out, connect_fail(DIST_EINVAL, "DIST_RANK=%ld / DIST_WORLD_SIZE=%ld "
                                          "do not fit a cluster of %d daemons", r, w,
                                          (*out)->n));
  /* A trainer whose cluster file lists the daemons in another order than
   * theirs would address another rank's daemon as its own, and its pieces
   * would land on the wrong ranks without an error. */
  char why[600];
  if (dist_check_own_daemon(*out, &o, (int)r, (int)w, why, sizeof why) != 0)
    return init_refused(out, connect_fail(DIST_EINVAL, "%s", why));
  (*out)->spmd_rank = (int)r;
  return 0;
}

void dist_close(dist_client *c) {
  if (!c) return;
  dist_client_later_undo(c); /* the last chance: the daemons' time-to-live else */
  dist_later_free(&c->later);
  for (int i = 0; i < c->n; i++) grpc_channel_destroy(c->channels[i]);
  if (c->auth_md_count) {
    grpc_slice_unref(c->auth_md.key);
    grpc_slice_unref(c->auth_md.value);
  }
  free(c->channels);
  free(c->endpoints);
  dist_daemon_crl_release(c->daemon_crl);
  free(c);
  grpc_shutdown();
  client_closed();
}

const char *dist_errmsg(const dist_client *c) {
  if (!c) return no_client_error;
  return c->err.code ? c->err.msg : "";
}
int dist_errcode(const dist_client *c) { return c ? c->err.code : DIST_EINVAL; }
int dist_world_size(const dist_client *c) { return c ? c->n : 0; }
int dist_rank(const dist_client *c) { return c ? c->spmd_rank : -1; }
const char *dist_endpoint(const dist_client *c, int rank) {
  return c && rank >= 0 && rank < c->n ? c->endpoints[rank] : NULL;
}

uint64_t dist_next_op_id(dist_client *c) { return c->op_base + ++c->op_seq; }

uint64_t dist_last_op_id(const dist_client *c) { return c->op_base + c->op_seq; }

void dist_take_ids_through(dist_client *c, uint64_t last) {
  while (dist_last_op_id(c) < last) dist_next_op_id(c);
}

uint64_t dist_take_ids(dist_client *c, int n) {
  uint64_t first = dist_last_op_id(c) + 1;
  dist_take_ids_through(c, first + (uint64_t)n - 1);
  return first;
}

int dist_targets(dist_client *c, const dist_mesh_desc *m, int *targets) {
  if (dist_check_mesh_reach(c, m) != 0) return c->err.code;
  if (c->spmd_rank >= 0) {
    if (dist_mesh_index_of(m, c->spmd_rank) < 0) return 0;
    targets[0] = c->spmd_rank;
    return 1;
  }
  for (int i = 0; i < m->nranks; i++) targets[i] = m->ranks[i];
  return m->nranks;
}
