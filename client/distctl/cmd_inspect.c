/* distctl ops / experts / metrics / top: looking inside a running cluster.
 *
 *  - ops: every daemon's operations in flight (with the ranks each still
 *    waits on, so a stuck peer shows at a glance) and its recent ones;
 *  - experts: the experts each daemon hosts and the tokens routed to them;
 *  - metrics: one daemon's Prometheus text, fetched from its HTTP port
 *    (Info names it);
 *  - top: a refreshing per-rank view built from Info.
 * A daemon that does not answer is listed with the reason and makes the exit
 * status 1; the others are still shown. */
#include <math.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "distctl.h"

#define DEFAULT_RECENT 20
#define HTTP_MAX (64u << 20) /* largest /metrics body accepted */

static void format_ranks(const int *r, int n, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; i < n && used < len; i++)
    used += (size_t)snprintf(buf + used, len - used, "%s%d", i ? "," : "", r[i]);
  if (n == 0) snprintf(buf, len, "-");
}

static json_t *int_array(const int *v, int n) {
  json_t *a = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
  return a;
}

static const char *state_name(dist_op_state s) {
  return s == DIST_OP_RUNNING ? "running" : s == DIST_OP_DONE ? "done" : "failed";
}

/* ---------------------------------------------------------------- ops */

static json_t *op_json(const dist_op_info *o) {
  char id[24];
  snprintf(id, sizeof id, "%llu", (unsigned long long)o->op_id);
  /* op_id is a string: it is a full uint64, beyond what JSON numbers keep. */
  return json_pack("{s:I,s:s,s:s,s:s,s:o,s:i,s:I,s:f,s:f,s:o,s:s}", "serial",
                   (json_int_t)o->serial, "op_id", id, "kind", o->kind, "state",
                   state_name(o->state), "group", int_array(o->group, o->ngroup),
                   "group_size", o->group_size, "bytes", (json_int_t)o->bytes,
                   "age_seconds", o->age_seconds, "duration_seconds", o->duration_seconds,
                   "waiting_on", int_array(o->waiting_on, o->nwaiting), "error", o->error);
}

static void print_op(int rank, const dist_op_info *o) {
  char waiting[128], bytes[32], group[128];
  format_ranks(o->waiting_on, o->nwaiting, waiting, sizeof waiting);
  format_ranks(o->group, o->ngroup, group, sizeof group);
  dist_format_bytes(o->bytes, bytes, sizeof bytes);
  printf("%-5d %-20llu %-15s %-8s %-10s %-12s %10s %8.1fs", rank,
         (unsigned long long)o->op_id, o->kind, state_name(o->state),
         o->state == DIST_OP_RUNNING ? waiting : "", group, bytes, o->age_seconds);
  if (o->state == DIST_OP_FAILED) printf("  %s", o->error);
  else if (o->state == DIST_OP_DONE) printf("  took %.3fs", o->duration_seconds);
  printf("\n");
}

/* ranks: the --json report's, whose entries for the ranks down say why. */
static void print_ops_table(dist_client *c, const dist_ops_report *rep, const int *ok,
                            json_t *ranks) {
  int n = (int)json_array_size(ranks);
  printf("%-5s %-20s %-15s %-8s %-10s %-12s %10s %9s\n", "RANK", "OP_ID", "KIND", "STATE",
         "WAITING_ON", "GROUP", "BYTES", "AGE");
  for (int r = 0; r < n; r++) { /* the ranks down first: what a hang waits on */
    json_t *why = json_object_get(json_array_get(ranks, (size_t)r), "error");
    if (!ok[r]) distctl_print_down_row(dist_daemon_rank(c, r), NULL, json_string_value(why));
  }
  for (int pass = 0; pass < 2; pass++) /* every rank's running ops first */
    for (int r = 0; r < n; r++) {
      if (!ok[r]) continue;
      int from = pass ? rep[r].n_in_flight : 0;
      int to = pass ? rep[r].n_in_flight + rep[r].n_recent : rep[r].n_in_flight;
      for (int i = from; i < to; i++) print_op(rep[r].rank, &rep[r].ops[i]);
    }
}

/* Arguments that may hold only `option` (once): its value in *text, or
 * NULL when not given. 0, or 2 after a usage error. */
static int parse_one_option(const distctl_command *cmd, int argc, char **argv,
                            const char *option, const char **text) {
  for (int i = 0; i < argc; i++) {
    int taken = distctl_opt_once(cmd, argc, argv, &i, option, text);
    if (taken == 2) return 2;
    if (!taken) return distctl_usage(cmd, "unknown argument '%s'", argv[i]);
  }
  return 0;
}

static json_t *ops_rank_json(const dist_ops_report *rep) {
  json_t *in = json_array(), *recent = json_array();
  for (int i = 0; i < rep->n_in_flight + rep->n_recent; i++)
    json_array_append_new(i < rep->n_in_flight ? in : recent, op_json(&rep->ops[i]));
  return json_pack("{s:i,s:o,s:o}", "rank", rep->rank, "in_flight", in, "recent", recent);
}

static int run_ops(const distctl_global *g, int argc, char **argv) {
  long recent = DEFAULT_RECENT;
  const char *text = NULL;
  if (parse_one_option(&distctl_cmd_ops, argc, argv, "--recent", &text) != 0) return 2;
  if (text && distctl_number_opt(&distctl_cmd_ops, "--recent", text, 0, 256, &recent)) return 2;
  dist_client *c = distctl_connect(g);
  if (!c) return 1;
  int n = dist_world_size(c), down = 0;
  dist_ops_report *rep = calloc((size_t)n, sizeof *rep);
  int *ok = calloc((size_t)n, sizeof *ok);
  json_t *ranks = json_array();
  for (int r = 0; r < n; r++) {
    /* recent = 0 asks for none here: the RPC's 0 means "all kept". */
    ok[r] = dist_ops(c, r, recent ? (int)recent : 1, &rep[r]) == 0;
    if (ok[r] && !recent) rep[r].n_recent = 0;
    if (!ok[r]) down++, distctl_rank_fail(c, r);
    json_array_append_new(ranks, ok[r] ? ops_rank_json(&rep[r])
                                       : distctl_down_json(c, r, dist_errmsg(c)));
  }
  if (g->json)
    distctl_print_json(json_pack("{s:i,s:i,s:o}", "world_size", n, "down", down, "ranks", ranks));
  else {
    print_ops_table(c, rep, ok, ranks);
    json_decref(ranks);
  }
  for (int r = 0; r < n; r++) dist_ops_report_free(&rep[r]);
  free(rep);
  free(ok);
  dist_close(c);
  return down ? 1 : 0;
}

/* ---------------------------------------------------------------- experts */

static json_t *experts_rank_json(const dist_experts_report *rep) {
  json_t *a = json_array();
  for (int i = 0; i < rep->n; i++) {
    const dist_expert_info *e = &rep->experts[i];
    json_array_append_new(a, json_pack("{s:i,s:I,s:I,s:I,s:I}", "expert", e->expert_id,
                                       "steps", (json_int_t)e->steps, "tokens_last",
                                       (json_int_t)e->tokens_last, "tokens_recent",
                                       (json_int_t)e->tokens_recent, "tokens_total",
                                       (json_int_t)e->tokens_total));
  }
  return json_pack("{s:i,s:i,s:o}", "rank", rep->rank, "window_steps", rep->window_steps,
                   "experts", a);
}

static void print_experts(int r, const dist_experts_report *rep) {
  if (rep->n == 0) printf("%-5d %-7s (no expert has received tokens)\n", r, "-");
  for (int i = 0; i < rep->n; i++) {
    const dist_expert_info *e = &rep->experts[i];
    printf("%-5d %-7d %8llu %12llu %14llu %14llu\n", r, e->expert_id,
           (unsigned long long)e->steps, (unsigned long long)e->tokens_last,
           (unsigned long long)e->tokens_recent, (unsigned long long)e->tokens_total);
  }
}

static int run_experts(const distctl_global *g, int argc, char **argv) {
  if (argc > 0) return distctl_usage(&distctl_cmd_experts, "unexpected argument '%s'", argv[0]);
  dist_client *c = distctl_connect(g);
  if (!c) return 1;
  int n = dist_world_size(c), down = 0;
  json_t *ranks = json_array();
  if (!g->json)
    printf("%-5s %-7s %8s %12s %14s %14s\n", "RANK", "EXPERT", "STEPS", "TOKENS_LAST",
           "TOKENS_RECENT", "TOKENS_TOTAL");
  for (int r = 0; r < n; r++) {
    dist_experts_report rep;
    if (dist_experts(c, r, &rep) != 0) {
      down++;
      distctl_rank_fail(c, r);
      json_array_append_new(ranks, distctl_down_json(c, r, dist_errmsg(c)));
      if (!g->json) distctl_print_down_row(dist_daemon_rank(c, r), NULL, dist_errmsg(c));
      continue;
    }
    json_array_append_new(ranks, experts_rank_json(&rep));
    if (!g->json) print_experts(rep.rank, &rep);
    dist_experts_report_free(&rep);
  }
  if (g->json)
    distctl_print_json(json_pack("{s:i,s:i,s:o}", "world_size", n, "down", down, "ranks", ranks));
  else
    json_decref(ranks);
  dist_close(c);
  return down ? 1 : 0;
}

/* ---------------------------------------------------------------- metrics */

/* "host:port" or "[v6]:port" into its parts. */
static int split_hostport(const char *addr, char *host, size_t hlen, char *port, size_t plen) {
  const char *colon = strrchr(addr, ':');
  if (!colon || !colon[1]) return -1;
  const char *h = addr;
  size_t n = (size_t)(colon - addr);
  if (n >= 2 && h[0] == '[' && h[n - 1] == ']') h++, n -= 2;
  if (n >= hlen || strlen(colon + 1) >= plen) return -1;
  memcpy(host, h, n);
  host[n] = 0;
  snprintf(port, plen, "%s", colon + 1);
  return 0;
}

/* The daemon's HTTP address, with a wildcard host replaced by the host its
 * gRPC endpoint was reached at. */
static int http_target(dist_client *c, int rank, const char *http, char *host, size_t hlen,
                       char *port, size_t plen) {
  char ghost[256], gport[16];
  if (split_hostport(http, host, hlen, port, plen) != 0) return -1;
  int wildcard = !host[0] || !strcmp(host, "0.0.0.0") || !strcmp(host, "::");
  if (wildcard && split_hostport(dist_endpoint(c, rank), ghost, sizeof ghost, gport,
                                 sizeof gport) == 0)
    snprintf(host, hlen, "%s", ghost);
  return 0;
}

static int dial(const char *host, const char *port, long timeout_ms) {
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
  if (getaddrinfo(host, port, &hints, &ai) != 0) return -1;
  int fd = -1;
  struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); /* bounds connect too */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) close(fd), fd = -1;
  }
  freeaddrinfo(ai);
  return fd;
}

/* GET path over HTTP/1.0; *body is the malloc'd body of a 200 reply. */
static int http_get(const char *host, const char *port, const char *path, long timeout_ms,
                    char **body, char *why, size_t wlen) {
  char req[512], *buf = NULL;
  size_t len = 0, cap = 0;
  int rc = -1, fd = dial(host, port, timeout_ms);
  *body = NULL;
  if (fd < 0) {
    snprintf(why, wlen, "cannot connect to %s:%s", host, port);
    return -1;
  }
  int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, host);
  if (write(fd, req, (size_t)n) != n) {
    snprintf(why, wlen, "cannot send the request to %s:%s", host, port);
    goto out;
  }
  for (;;) {
    if (len + 4096 + 1 > cap) {
      char *b = cap < HTTP_MAX ? realloc(buf, cap = cap ? 2 * cap : 65536) : NULL;
      if (!b) {
        snprintf(why, wlen, "reply from %s:%s too large", host, port);
        goto out;
      }
      buf = b;
    }
    ssize_t got = read(fd, buf + len, cap - len - 1);
    if (got == 0) break;
    if (got < 0) {
      snprintf(why, wlen, "no complete reply from %s:%s within %ld ms", host, port, timeout_ms);
      goto out;
    }
    len += (size_t)got;
  }
  buf[len] = 0;
  char *sep = strstr(buf, "\r\n\r\n");
  int status = 0;
  if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1 || status != 200 || !sep) {
    char first[160];
    size_t n = strcspn(buf, "\r\n");
    if (n >= sizeof first) n = sizeof first - 1;
    memcpy(first, buf, n);
    first[n] = 0;
    snprintf(why, wlen, "%s:%s answered: %s", host, port, first);
    goto out;
  }
  *body = strdup(sep + 4);
  rc = 0;
out:
  free(buf);
  close(fd);
  return rc;
}

/* One exposition line "name{a="x",b="y"} value" as JSON; NULL for comments
 * and lines it cannot read. */
static json_t *sample_json(const char *line) {
  size_t nl = strcspn(line, "{ ");
  if (!nl || line[0] == '#') return NULL;
  json_t *labels = json_object();
  const char *p = line + nl;
  if (*p == '{') {
    p++;
    while (*p && *p != '}') {
      size_t kl = strcspn(p, "=");
      if (p[kl] != '=' || p[kl + 1] != '"') break;
      char key[128], val[512];
      size_t vi = 0;
      const char *q = p + kl + 2;
      for (; *q && *q != '"'; q++) {
        if (*q == '\\' && q[1]) q++;
        if (vi < sizeof val - 1) val[vi++] = *q;
      }
      val[vi] = 0;
      snprintf(key, sizeof key, "%.*s", (int)kl, p);
      json_object_set_new(labels, key, json_string(val));
      p = *q ? q + 1 : q;
      if (*p == ',') p++;
    }
    if (*p == '}') p++;
  }
  double v = strtod(p, NULL);
  char name[256];
  snprintf(name, sizeof name, "%.*s", (int)nl, line);
  /* JSON has no Inf or NaN: those stay strings, as Prometheus writes them. */
  json_t *value = isfinite(v) ? json_real(v) : json_string(p + strspn(p, " "));
  return json_pack("{s:s,s:o,s:o}", "name", name, "labels", labels, "value", value);
}

static json_t *samples_json(char *text) {
  json_t *a = json_array();
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    json_t *s = sample_json(line);
    if (s) json_array_append_new(a, s);
  }
  return a;
}

static int run_metrics(const distctl_global *g, int argc, char **argv) {
  long rank = 0;
  const char *text = NULL;
  if (parse_one_option(&distctl_cmd_metrics, argc, argv, "--rank", &text) != 0) return 2;
  if (text && distctl_number_opt(&distctl_cmd_metrics, "--rank", text, 0, 1 << 20, &rank))
    return 2;
  dist_client *c = distctl_connect(g);
  if (!c) return 1;
  dist_daemon_info info;
  char host[256], port[16], why[512], *body = NULL;
  long timeout = g->timeout_ms > 0 ? g->timeout_ms : 10000;
  int rc = distctl_rank_in_cluster(&distctl_cmd_metrics, c, rank);
  if (rc != 0) {
    dist_close(c);
    return rc;
  }
  rc = 1;
  if (dist_info(c, (int)rank, &info) != 0) {
    distctl_rank_fail(c, rank);
    goto out;
  }
  if (!info.http_address[0]) {
    distctl_fail("rank %d serves no HTTP port (http_listen = off)", info.rank);
    goto out;
  }
  if (http_target(c, (int)rank, info.http_address, host, sizeof host, port, sizeof port) != 0 ||
      http_get(host, port, "/metrics", timeout, &body, why, sizeof why) != 0) {
    distctl_fail("rank %d metrics at %s: %s", info.rank, info.http_address, why);
    goto out;
  }
  if (g->json)
    distctl_print_json(json_pack("{s:i,s:s,s:o}", "rank", info.rank, "http_address",
                                 info.http_address, "samples", samples_json(body)));
  else
    fputs(body, stdout);
  rc = 0;
out:
  free(body);
  dist_info_free(&info);
  dist_close(c);
  return rc;
}

/* ---------------------------------------------------------------- top */

typedef struct sample {
  int ok;
  int rank; /* the daemon's own; -1: a daemon of --endpoint that did not say */
  char error[256];
  dist_daemon_info info;
  uint64_t sent, received; /* summed over peers */
  double at;               /* CLOCK_MONOTONIC seconds */
  dist_client *from;       /* asked at its position 0 */
  char named[24];          /* how its errors start: "rank R: ", or "" */
} sample;

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One rank's Info, in a thread of its own: its client is its own too. */
static void *sample_one(void *arg) {
  sample *s = arg;
  s->ok = s->from && dist_info(s->from, 0, &s->info) == 0;
  s->at = mono();
  if (!s->ok)
    snprintf(s->error, sizeof s->error, "%s%s", s->named,
             s->from ? dist_errmsg(s->from) : "cannot connect");
  for (int p = 0; s->ok && p < s->info.npeers; p++) {
    s->sent += s->info.peers[p].bytes_sent;
    s->received += s->info.peers[p].bytes_received;
  }
  return NULL;
}

/* A client of each daemon of c, so that a sample asks them all at once:
 * a rank that does not answer holds up a sample by one timeout, not one
 * for each such rank. A client of one daemon (--endpoint) is its own. */
static dist_client **clients_of_each(const distctl_global *g, dist_client *c, int n) {
  dist_client **one = calloc((size_t)n, sizeof *one);
  for (int r = 0; r < n && n == 1; r++) one[r] = c;
  for (int r = 0; r < n && n > 1; r++) {
    distctl_global each = *g;
    each.cluster = NULL, each.endpoint = dist_endpoint(c, r);
    one[r] = distctl_connect(&each);
  }
  return one;
}

static void close_each(dist_client **one, int n) {
  for (int r = 0; r < n && n > 1; r++) dist_close(one[r]);
  free(one);
}

static void take_samples(dist_client *c, dist_client **one, sample *s, int n) {
  pthread_t *threads = calloc((size_t)n, sizeof *threads);
  int *started = calloc((size_t)n, sizeof *started);
  for (int r = 0; r < n; r++) {
    dist_info_free(&s[r].info);
    memset(&s[r], 0, sizeof s[r]);
    s[r].from = one[r];
    /* A client of one daemon names it by its address: say which rank. */
    if (one[r] != c) snprintf(s[r].named, sizeof s[r].named, "rank %d: ", r);
    started[r] = pthread_create(&threads[r], NULL, sample_one, &s[r]) == 0;
    if (!started[r]) sample_one(&s[r]); /* out of threads: asked in turn */
  }
  for (int r = 0; r < n; r++) {
    if (started[r]) pthread_join(threads[r], NULL);
    s[r].rank = s[r].ok ? s[r].info.rank : dist_daemon_rank(c, r);
  }
  free(threads);
  free(started);
}

/* Bytes per second between two samples of one rank; -1 when unknown. */
static double rate(const sample *now, const sample *before, int sent) {
  if (!before || !before->ok || !now->ok || now->at <= before->at) return -1;
  uint64_t a = sent ? now->sent : now->received, b = sent ? before->sent : before->received;
  return a >= b ? (double)(a - b) / (now->at - before->at) : 0;
}

static int peers_up(const dist_daemon_info *i) {
  int up = 0;
  for (int p = 0; p < i->npeers; p++) up += i->peers[p].connected;
  return up;
}

static void format_rate(double r, char *buf, size_t len) {
  if (r < 0) {
    snprintf(buf, len, "-");
    return;
  }
  dist_format_bytes((uint64_t)r, buf, len);
  strncat(buf, "/s", len - strlen(buf) - 1);
}

static void print_top(const sample *now, const sample *before, int n, int iteration,
                      long iterations, double interval) {
  int up = 0, ops = 0;
  for (int r = 0; r < n; r++)
    if (now[r].ok) up++, ops += (int)now[r].info.ops_in_flight;
  printf("distd top: %d ranks, %d up, %d ops in flight; refresh %.1fs", n, up, ops, interval);
  if (iterations) printf(" (%d/%ld)", iteration, iterations);
  printf("\n\n%-5s %-9s %-10s %9s %11s %8s %5s %6s %13s %13s\n", "RANK", "STATE", "VERSION",
         "UPTIME", "MEMORY", "TENSORS", "OPS", "PEERS", "SENT", "RECEIVED");
  for (int r = 0; r < n; r++) {
    if (!now[r].ok) {
      distctl_print_down_row(now[r].rank, NULL, now[r].error);
      continue;
    }
    const dist_daemon_info *i = &now[r].info;
    char mem[32], sent[40], recv[40], peers[16];
    dist_format_bytes(i->tensor_bytes, mem, sizeof mem);
    format_rate(rate(&now[r], before ? &before[r] : NULL, 1), sent, sizeof sent);
    format_rate(rate(&now[r], before ? &before[r] : NULL, 0), recv, sizeof recv);
    snprintf(peers, sizeof peers, "%d/%d", peers_up(i), i->npeers);
    printf("%-5d %-9s %-10s %8.0fs %11s %8u %5u %6s %13s %13s\n", now[r].rank,
           peers_up(i) == i->npeers ? "healthy" : "degraded", i->version, i->uptime_seconds,
           mem, i->tensor_count, i->ops_in_flight, peers, sent, recv);
  }
  fflush(stdout);
}

static json_t *top_json(const sample *now, const sample *before, int n) {
  json_t *ranks = json_array();
  int down = 0;
  for (int r = 0; r < n; r++) {
    down += !now[r].ok;
    const dist_daemon_info *i = &now[r].info;
    json_array_append_new(
        ranks, !now[r].ok
                   ? json_pack("{s:o,s:s,s:s}", "rank", distctl_rank_value(now[r].rank), "state",
                               "down", "error", now[r].error)
                   : json_pack("{s:i,s:s,s:s,s:f,s:I,s:I,s:i,s:i,s:i,s:i,s:f,s:f}", "rank",
                               now[r].rank,
                               "state", peers_up(i) == i->npeers ? "healthy" : "degraded",
                               "version", i->version, "uptime_seconds", i->uptime_seconds,
                               "tensor_bytes", (json_int_t)i->tensor_bytes,
                               "tensor_bytes_limit", (json_int_t)i->tensor_bytes_limit,
                               "tensors", (int)i->tensor_count, "ops_in_flight",
                               (int)i->ops_in_flight, "peers_connected", peers_up(i), "peers",
                               i->npeers, "sent_bytes_per_second",
                               fmax(0, rate(&now[r], &before[r], 1)),
                               "received_bytes_per_second",
                               fmax(0, rate(&now[r], &before[r], 0))));
  }
  return json_pack("{s:i,s:i,s:o}", "world_size", n, "down", down, "ranks", ranks);
}

static void pause_seconds(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* --iterations and --interval (each once); 0, or 2 after a usage error. */
static int parse_top_args(int argc, char **argv, long *iterations, double *interval) {
  const distctl_command *cmd = &distctl_cmd_top;
  const char *its = NULL, *every = NULL;
  for (int i = 0; i < argc; i++) {
    int taken = distctl_opt_once(cmd, argc, argv, &i, "--iterations", &its);
    if (!taken) taken = distctl_opt_once(cmd, argc, argv, &i, "--interval", &every);
    if (taken == 2) return 2;
    if (!taken) return distctl_usage(cmd, "unknown argument '%s'", argv[i]);
  }
  if (its && distctl_number_opt(cmd, "--iterations", its, 0, 1L << 30, iterations)) return 2;
  char *end = NULL;
  if (every) *interval = strtod(every, &end);
  if (every && (!*every || *end || !(*interval >= 0.05 && *interval <= 3600)))
    return distctl_usage(cmd, "bad --interval '%s': seconds, from 0.05 to 3600", every);
  return 0;
}

static int run_top(const distctl_global *g, int argc, char **argv) {
  long iterations = 0;
  double interval = 1.0;
  if (parse_top_args(argc, argv, &iterations, &interval) != 0) return 2;
  dist_client *c = distctl_connect(g);
  if (!c) return 1;
  int n = dist_world_size(c), tty = isatty(STDOUT_FILENO), rc = 0;
  sample *now = calloc((size_t)n, sizeof *now), *before = calloc((size_t)n, sizeof *before);
  dist_client **one = clients_of_each(g, c, n);
  take_samples(c, one, now, n);
  if (g->json) { /* one snapshot: rates over one interval */
    sample *t = before;
    before = now, now = t;
    pause_seconds(interval);
    take_samples(c, one, now, n);
    distctl_print_json(top_json(now, before, n));
  }
  for (int it = 1; !g->json; it++) {
    if (tty) printf("\033[H\033[2J"); /* clear and home, like top */
    else if (it > 1) printf("\n");
    print_top(now, it > 1 ? before : NULL, n, it, iterations, interval);
    if (iterations && it >= iterations) break;
    pause_seconds(interval);
    sample *t = before;
    before = now, now = t;
    take_samples(c, one, now, n);
  }
  for (int r = 0; r < n; r++) {
    if (!now[r].ok) rc = 1;
    dist_info_free(&now[r].info);
    dist_info_free(&before[r].info);
  }
  free(now);
  free(before);
  close_each(one, n);
  dist_close(c);
  return rc;
}

const distctl_command distctl_cmd_ops = {
    "ops", "[--recent N]",
    "operations in flight on every rank (with the ranks they wait on) and recent ones",
    run_ops};
const distctl_command distctl_cmd_experts = {
    "experts", "", "the experts each rank hosts and the tokens routed to them", run_experts};
const distctl_command distctl_cmd_metrics = {
    "metrics", "[--rank R]", "one rank's Prometheus metrics, from its HTTP port", run_metrics};
const distctl_command distctl_cmd_top = {
    "top", "[--iterations N] [--interval SECONDS]",
    "a live view of every rank, refreshed like top, its ranks asked at once; the byte\n"
    "      rates need two samples: the first refresh has none, and --json (one snapshot)\n"
    "      takes two, --interval apart, each waiting at most --timeout for a rank",
    run_top};
