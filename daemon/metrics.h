/* Prometheus metrics of one daemon. Counters and histograms are updated from
 * any thread; the text exposition (format 0.0.4) is lint-clean under
 * `promtool check metrics`. Names follow deploy.md:
 *   distd_build_info{version}                      gauge 1
 *   distd_rpc_requests_total{method,code}          counter
 *   distd_rpc_duration_seconds{method}             histogram
 *   distd_collectives_total{kind,result}           counter
 *   distd_collective_bytes_total{kind}             counter
 *   distd_collective_duration_seconds{kind}        histogram
 *   distd_auth_rejected_total{reason}              counter
 * Gauges that reflect current state (peers, tensor memory, uptime,
 * parameters: distd_param_updates_total{param}, distd_param_pushes_pending
 * {param}, distd_param_state_bytes) are
 * written by the caller of distd_metrics_write through its gauge hook. */
#ifndef DISTD_METRICS_H
#define DISTD_METRICS_H

#include <stdint.h>

struct evbuffer;
typedef struct distd_metrics distd_metrics;

distd_metrics *distd_metrics_new(const char *version);
void distd_metrics_free(distd_metrics *m); /* NULL is a no-op */

/* method: short name ("Info", "TensorPut", "grpc.health.v1.Health/Check");
 * code: a grpc_status_code as its canonical upper-case name is printed
 * ("OK", "NOT_FOUND"). */
void distd_metrics_rpc(distd_metrics *m, const char *method, int grpc_code,
                       double seconds);
void distd_metrics_collective(distd_metrics *m, const char *kind, int ok,
                              uint64_t bytes, double seconds);
void distd_metrics_auth_rejected(distd_metrics *m, const char *reason);

/* Appends the exposition of everything recorded here to out. */
void distd_metrics_write(distd_metrics *m, struct evbuffer *out);

/* Helpers for the caller's gauges: write "# HELP", "# TYPE" and samples. */
void distd_metrics_gauge_header(struct evbuffer *out, const char *name,
                                const char *type, const char *help);
/* name{label="value"} sample, value escaped (tensor names are free-form). */
void distd_metrics_sample(struct evbuffer *out, const char *name, const char *label,
                          const char *value, double sample);
#endif
