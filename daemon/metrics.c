/* A small Prometheus registry: a fixed set of labelled counter and histogram
 * families, each a growable array of series, behind one mutex. Recording is
 * a short linear search plus an increment; the series count per family is
 * capped so that label values a client can influence (method names of
 * unknown RPCs) cannot grow memory without bound. */
#include "metrics.h"

#include <event2/buffer.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Beyond this many label sets a family folds new ones into "other". */
#define MAX_SERIES 256
#define OVERFLOW_LABEL "other"

/* RPC latency: 50us (a local Info) up to 10s (a large tensor transfer). */
static const double rpc_bounds[] = {
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05,    0.1,    0.25,    0.5,    1,     2.5,    5,     10};

/* Collectives wait on the slowest peer, so the range reaches a minute. */
static const double coll_bounds[] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25,   0.5,     1,      2.5,   5,      10,    30,   60};

#define NBOUNDS(a) ((int)(sizeof(a) / sizeof((a)[0])))

typedef struct series {
  char *labels[2];
  uint64_t value;    /* counters */
  uint64_t *buckets; /* histograms: per-bucket (not cumulative), nbounds+1 */
  uint64_t count;
  double sum;
} series;

typedef struct family {
  const char *name;
  const char *type; /* "counter" or "histogram" */
  const char *help;
  const char *label_names[2];
  int nlabels;
  const double *bounds; /* NULL for counters */
  int nbounds;
  series *s;
  size_t n, cap;
} family;

enum { F_RPC_REQ, F_RPC_DUR, F_COLL, F_COLL_BYTES, F_COLL_DUR, F_AUTH, F_COUNT };

struct distd_metrics {
  pthread_mutex_t lock;
  char *version;
  family f[F_COUNT];
};

static const family family_defs[F_COUNT] = {
    [F_RPC_REQ] = {"distd_rpc_requests_total", "counter",
                   "gRPC requests handled, by method and status code.",
                   {"method", "code"}, 2, NULL, 0, NULL, 0, 0},
    [F_RPC_DUR] = {"distd_rpc_duration_seconds", "histogram",
                   "Time from receiving a gRPC request to sending its status.",
                   {"method", NULL}, 1, rpc_bounds, NBOUNDS(rpc_bounds), NULL,
                   0, 0},
    [F_COLL] = {"distd_collectives_total", "counter",
                "Collective operations finished, by kind and result.",
                {"kind", "result"}, 2, NULL, 0, NULL, 0, 0},
    [F_COLL_BYTES] = {"distd_collective_bytes_total", "counter",
                      "Tensor bytes moved by collective operations, by kind.",
                      {"kind", NULL}, 1, NULL, 0, NULL, 0, 0},
    [F_COLL_DUR] = {"distd_collective_duration_seconds", "histogram",
                    "Duration of collective operations, by kind.",
                    {"kind", NULL}, 1, coll_bounds, NBOUNDS(coll_bounds), NULL,
                    0, 0},
    [F_AUTH] = {"distd_auth_rejected_total", "counter",
                "Requests or peer connections rejected by authentication.",
                {"reason", NULL}, 1, NULL, 0, NULL, 0, 0},
};

/* Indexed by grpc_status_code; kept here so metrics.c needs no gRPC header. */
static const char *const grpc_code_names[] = {
    "OK",                "CANCELLED",          "UNKNOWN",
    "INVALID_ARGUMENT",  "DEADLINE_EXCEEDED",  "NOT_FOUND",
    "ALREADY_EXISTS",    "PERMISSION_DENIED",  "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION", "ABORTED",          "OUT_OF_RANGE",
    "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS",         "UNAUTHENTICATED"};

static const char *grpc_code_name(int code) {
  int n = (int)(sizeof grpc_code_names / sizeof grpc_code_names[0]);
  return code >= 0 && code < n ? grpc_code_names[code] : "UNKNOWN";
}

distd_metrics *distd_metrics_new(const char *version) {
  distd_metrics *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->version = strdup(version ? version : "unknown");
  if (!m->version || pthread_mutex_init(&m->lock, NULL) != 0) {
    free(m->version);
    free(m);
    return NULL;
  }
  memcpy(m->f, family_defs, sizeof m->f);
  return m;
}

void distd_metrics_free(distd_metrics *m) {
  if (!m) return;
  for (int i = 0; i < F_COUNT; i++) {
    family *f = &m->f[i];
    for (size_t j = 0; j < f->n; j++) {
      free(f->s[j].labels[0]);
      free(f->s[j].labels[1]);
      free(f->s[j].buckets);
    }
    free(f->s);
  }
  pthread_mutex_destroy(&m->lock);
  free(m->version);
  free(m);
}

static int labels_match(const family *f, const series *s, const char *a,
                        const char *b) {
  if (strcmp(s->labels[0], a) != 0) return 0;
  return f->nlabels < 2 || strcmp(s->labels[1], b) == 0;
}

static series *find_series(family *f, const char *a, const char *b) {
  for (size_t i = 0; i < f->n; i++)
    if (labels_match(f, &f->s[i], a, b)) return &f->s[i];
  return NULL;
}

/* Appends a zeroed series; NULL when out of memory. */
static series *add_series(family *f, const char *a, const char *b) {
  if (f->n == f->cap) {
    size_t cap = f->cap ? f->cap * 2 : 8;
    series *s = realloc(f->s, cap * sizeof *s);
    if (!s) return NULL;
    f->s = s;
    f->cap = cap;
  }
  series *s = &f->s[f->n];
  memset(s, 0, sizeof *s);
  s->labels[0] = strdup(a);
  s->labels[1] = f->nlabels > 1 ? strdup(b) : NULL;
  if (f->bounds) s->buckets = calloc((size_t)f->nbounds + 1, sizeof(uint64_t));
  if (!s->labels[0] || (f->nlabels > 1 && !s->labels[1]) ||
      (f->bounds && !s->buckets)) {
    free(s->labels[0]);
    free(s->labels[1]);
    free(s->buckets);
    return NULL;
  }
  f->n++;
  return s;
}

/* The series for these label values, created on first use. Past MAX_SERIES
 * new label sets share one series whose first label is "other". Called with
 * the lock held; NULL only when out of memory (the sample is dropped). */
static series *get_series(family *f, const char *a, const char *b) {
  if (!a) a = "";
  if (!b) b = "";
  series *s = find_series(f, a, b);
  if (s) return s;
  if (f->n >= MAX_SERIES) {
    a = OVERFLOW_LABEL;
    s = find_series(f, a, b);
    if (s) return s;
  }
  return add_series(f, a, b);
}

static void count_add(distd_metrics *m, int fam, const char *a, const char *b,
                      uint64_t delta) {
  pthread_mutex_lock(&m->lock);
  series *s = get_series(&m->f[fam], a, b);
  if (s) s->value += delta;
  pthread_mutex_unlock(&m->lock);
}

static void observe(distd_metrics *m, int fam, const char *a, double v) {
  pthread_mutex_lock(&m->lock);
  family *f = &m->f[fam];
  series *s = get_series(f, a, NULL);
  if (s) {
    int i = 0;
    while (i < f->nbounds && v > f->bounds[i]) i++;
    s->buckets[i]++;
    s->count++;
    s->sum += v;
  }
  pthread_mutex_unlock(&m->lock);
}

void distd_metrics_rpc(distd_metrics *m, const char *method, int grpc_code,
                       double seconds) {
  if (!m) return;
  count_add(m, F_RPC_REQ, method, grpc_code_name(grpc_code), 1);
  observe(m, F_RPC_DUR, method, seconds);
}

void distd_metrics_collective(distd_metrics *m, const char *kind, int ok,
                              uint64_t bytes, double seconds) {
  if (!m) return;
  count_add(m, F_COLL, kind, ok ? "ok" : "error", 1);
  count_add(m, F_COLL_BYTES, kind, NULL, bytes);
  observe(m, F_COLL_DUR, kind, seconds);
}

void distd_metrics_auth_rejected(distd_metrics *m, const char *reason) {
  if (!m) return;
  count_add(m, F_AUTH, reason, NULL, 1);
}

/* Label values escape backslash, double quote and newline (format 0.0.4);
 * HELP text escapes only backslash and newline. */
static void add_escaped(struct evbuffer *out, const char *s, int quote) {
  for (; *s; s++) {
    if (*s == '\\')
      evbuffer_add(out, "\\\\", 2);
    else if (*s == '\n')
      evbuffer_add(out, "\\n", 2);
    else if (*s == '"' && quote)
      evbuffer_add(out, "\\\"", 2);
    else
      evbuffer_add(out, s, 1);
  }
}

void distd_metrics_sample(struct evbuffer *out, const char *name, const char *label,
                          const char *value, double sample) {
  evbuffer_add_printf(out, "%s{%s=\"", name, label);
  add_escaped(out, value, 1);
  evbuffer_add_printf(out, "\"} %.17g\n", sample);
}

void distd_metrics_gauge_header(struct evbuffer *out, const char *name,
                                const char *type, const char *help) {
  evbuffer_add_printf(out, "# HELP %s ", name);
  add_escaped(out, help, 0);
  evbuffer_add_printf(out, "\n# TYPE %s %s\n", name, type);
}

/* Writes `{l0="v0",l1="v1"` without the closing brace, so that histogram
 * buckets can append their `le`. */
static void add_labels_open(struct evbuffer *out, const family *f,
                            const series *s) {
  evbuffer_add_printf(out, "{%s=\"", f->label_names[0]);
  add_escaped(out, s->labels[0], 1);
  evbuffer_add(out, "\"", 1);
  if (f->nlabels > 1) {
    evbuffer_add_printf(out, ",%s=\"", f->label_names[1]);
    add_escaped(out, s->labels[1], 1);
    evbuffer_add(out, "\"", 1);
  }
}

static void write_histogram(struct evbuffer *out, const family *f,
                            const series *s) {
  uint64_t cumulative = 0;
  for (int i = 0; i <= f->nbounds; i++) {
    cumulative += s->buckets[i];
    evbuffer_add_printf(out, "%s_bucket", f->name);
    add_labels_open(out, f, s);
    if (i < f->nbounds)
      evbuffer_add_printf(out, ",le=\"%g\"} %llu\n", f->bounds[i],
                          (unsigned long long)cumulative);
    else
      evbuffer_add_printf(out, ",le=\"+Inf\"} %llu\n",
                          (unsigned long long)cumulative);
  }
  evbuffer_add_printf(out, "%s_sum", f->name);
  add_labels_open(out, f, s);
  evbuffer_add_printf(out, "} %.15g\n%s_count", s->sum, f->name);
  add_labels_open(out, f, s);
  evbuffer_add_printf(out, "} %llu\n", (unsigned long long)s->count);
}

static void write_family(struct evbuffer *out, const family *f) {
  /* The name in HELP/TYPE is the family name, without _bucket etc. */
  distd_metrics_gauge_header(out, f->name, f->type, f->help);
  for (size_t i = 0; i < f->n; i++) {
    const series *s = &f->s[i];
    if (f->bounds) {
      write_histogram(out, f, s);
      continue;
    }
    evbuffer_add(out, f->name, strlen(f->name));
    add_labels_open(out, f, s);
    evbuffer_add_printf(out, "} %llu\n", (unsigned long long)s->value);
  }
}

void distd_metrics_write(distd_metrics *m, struct evbuffer *out) {
  if (!m) return;
  distd_metrics_gauge_header(out, "distd_build_info", "gauge",
                             "Always 1; the version label names the build.");
  evbuffer_add_printf(out, "distd_build_info{version=\"");
  add_escaped(out, m->version, 1);
  evbuffer_add_printf(out, "\"} 1\n");
  pthread_mutex_lock(&m->lock);
  for (int i = 0; i < F_COUNT; i++) write_family(out, &m->f[i]);
  pthread_mutex_unlock(&m->lock);
}
