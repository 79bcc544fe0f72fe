/* distctl top: a refreshing per-rank view built from Info. A daemon that
 * does not answer is listed with the reason and makes the exit status 1;
 * the others are still shown. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "distctl.h"

typedef struct sample {
  int ok;
  int rank; /* the daemon's own; -1: a daemon of --endpoint that did not say */
  char error[512];
  dist_daemon_info info;
  uint64_t sent, received; /* summed over peers */
  double at;               /* CLOCK_MONOTONIC seconds */
} sample;

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One rank's Info, timed when it came. */
static int sample_one(dist_client *one, void *slot, void *arg) {
  sample *s = slot;
  (void)arg;
  int rc = dist_info(one, 0, &s->info);
  s->at = mono();
  for (int p = 0; rc == 0 && p < s->info.npeers; p++) {
    s->sent += s->info.peers[p].bytes_sent;
    s->received += s->info.peers[p].bytes_received;
  }
  return rc;
}

/* 0, or -1 when out of memory (said on stderr). */
static int take_samples(dist_client *c, const distctl_ranks *each, sample *s, int n) {
  distctl_answer *a = distctl_calloc((size_t)n + 1, sizeof *a, "the answers of %d ranks", n);
  if (!a) return -1;
  for (int r = 0; r < n; r++) {
    dist_info_free(&s[r].info);
    memset(&s[r], 0, sizeof s[r]);
  }
  int down = distctl_ranks_ask(each, sample_one, NULL, s, sizeof *s, a);
  for (int r = 0; r < n && down >= 0; r++) {
    s[r].ok = a[r].ok;
    snprintf(s[r].error, sizeof s[r].error, "%s", a[r].error);
    s[r].rank = s[r].ok ? s[r].info.rank : dist_daemon_rank(c, r);
  }
  free(a);
  return down < 0 ? -1 : 0;
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

enum { OPT_ITERATIONS, OPT_INTERVAL, NOPTIONS };
static const distctl_option options[NOPTIONS + 1] = {
    [OPT_ITERATIONS] = {"--iterations", "N", "refreshes to show before exiting (default 0: "
                        "until interrupted)", NULL, DISTCTL_OPTIONAL},
    [OPT_INTERVAL] = {"--interval", "SECONDS", "time between refreshes, 0.05 to 3600 "
                      "(default 1)", NULL, DISTCTL_OPTIONAL},
};

/* --iterations and --interval (each once); 0, or 2 after a usage error. */
static int parse_top_args(int argc, char **argv, long *iterations, double *interval) {
  const distctl_command *cmd = &distctl_cmd_top;
  distctl_args args;
  if (distctl_take_options(cmd, argc, argv, &args) != 0) return 2;
  const char *its = args.value[OPT_ITERATIONS], *every = args.value[OPT_INTERVAL];
  if (its && distctl_number_opt(cmd, "--iterations", its, 0, 1L << 30, iterations)) return 2;
  char *end = NULL;
  if (every) *interval = strtod(every, &end);
  if (every && (!*every || *end || !(*interval >= 0.05 && *interval <= 3600)))
    return distctl_usage(cmd, "bad --interval '%s': seconds, from 0.05 to 3600", every);
  return 0;
}

/* What top keeps between refreshes. */
typedef struct top_view {
  dist_client *c;
  distctl_ranks *each;
  sample *now, *before; /* every rank's last two samples */
  int n;
} top_view;

/* The last sample becomes the one before, and a new one is taken: 0, or
 * -1 when out of memory (said on stderr). */
static int next_sample(top_view *v) {
  sample *t = v->before;
  v->before = v->now, v->now = t;
  return take_samples(v->c, v->each, v->now, v->n);
}

/* The table, refreshed every interval (iterations times; 0: until
 * interrupted). 0, or -1 when out of memory or when a refresh could not
 * be written (it would refresh into the void forever). */
static int show_refreshes(top_view *v, long iterations, double interval) {
  int tty = isatty(STDOUT_FILENO);
  for (int it = 1;; it++) {
    if (tty) printf("\033[H\033[2J"); /* clear and home, like top */
    else if (it > 1) printf("\n");
    print_top(v->now, it > 1 ? v->before : NULL, v->n, it, iterations, interval);
    if (distctl_output_flushed() != 0) return -1;
    if (iterations && it >= iterations) return 0;
    pause_seconds(interval);
    if (next_sample(v) != 0) return -1;
  }
}

static int run_top(const distctl_global *g, int argc, char **argv) {
  long iterations = 0;
  double interval = 1.0;
  if (parse_top_args(argc, argv, &iterations, &interval) != 0) return 2;
  dist_client *c = distctl_connect(g);
  if (!c) return 1;
  int n = dist_world_size(c), rc = 1;
  top_view v = {.c = c, .n = n};
  v.now = distctl_calloc((size_t)n + 1, sizeof *v.now, "the samples of %d ranks", n);
  v.before = v.now ? distctl_calloc((size_t)n + 1, sizeof *v.before, "the samples of %d ranks",
                                    n) : NULL;
  v.each = v.before ? distctl_ranks_open(g, c) : NULL;
  if (!v.each || take_samples(c, v.each, v.now, n) != 0) goto out;
  if (g->json) { /* one snapshot: rates over one interval */
    pause_seconds(interval);
    if (next_sample(&v) != 0) goto out;
    distctl_print_json(top_json(v.now, v.before, n));
  } else if (show_refreshes(&v, iterations, interval) != 0) {
    goto out;
  }
  rc = 0;
  for (int r = 0; r < n; r++) rc |= !v.now[r].ok;
out:
  for (int r = 0; r < n && v.before; r++) {
    dist_info_free(&v.now[r].info);
    dist_info_free(&v.before[r].info);
  }
  free(v.now);
  free(v.before);
  distctl_ranks_close(v.each);
  dist_close(c);
  return rc;
}

const distctl_command distctl_cmd_top = {
    .name = "top",
    .help = "a live view of every rank, refreshed like top, its ranks asked at once; the byte\n"
    "      rates need two samples: the first refresh has none, and --json (one snapshot)\n"
    "      takes two, --interval apart, each waiting at most --timeout for a rank",
    .run = run_top,
    .options = options};
