#include "status.h"

#include <stdio.h>
#include <string.h>

grpc_status_code dist_err_to_grpc(int err) {
  switch (err) {
    case DIST_OK: return GRPC_STATUS_OK;
    case DIST_EINVAL:
    case DIST_EMISMATCH:
    case DIST_ECONFIG: return GRPC_STATUS_INVALID_ARGUMENT;
    case DIST_ENOTFOUND: return GRPC_STATUS_NOT_FOUND;
    case DIST_EEXIST: return GRPC_STATUS_ALREADY_EXISTS;
    case DIST_ENOMEM:
    case DIST_ETOOBIG: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case DIST_EUNAVAIL:
    case DIST_EPEER: return GRPC_STATUS_UNAVAILABLE;
    case DIST_ETIMEDOUT: return GRPC_STATUS_DEADLINE_EXCEEDED;
    case DIST_ENOTSUP: return GRPC_STATUS_UNIMPLEMENTED;
    case DIST_EPERM: return GRPC_STATUS_PERMISSION_DENIED;
    case DIST_EAUTH: return GRPC_STATUS_UNAUTHENTICATED;
    case DIST_ECANCELED: return GRPC_STATUS_CANCELLED;
    case DIST_EPROTO:
    case DIST_EIO:
    case DIST_EINTERNAL:
    default: return GRPC_STATUS_INTERNAL;
  }
}

int dist_err_from_grpc(grpc_status_code code) {
  switch (code) {
    case GRPC_STATUS_OK: return DIST_OK;
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_OUT_OF_RANGE:
    case GRPC_STATUS_FAILED_PRECONDITION: return DIST_EINVAL;
    case GRPC_STATUS_NOT_FOUND: return DIST_ENOTFOUND;
    case GRPC_STATUS_ALREADY_EXISTS: return DIST_EEXIST;
    case GRPC_STATUS_RESOURCE_EXHAUSTED: return DIST_ETOOBIG;
    case GRPC_STATUS_UNAVAILABLE: return DIST_EUNAVAIL;
    case GRPC_STATUS_DEADLINE_EXCEEDED: return DIST_ETIMEDOUT;
    case GRPC_STATUS_UNIMPLEMENTED: return DIST_ENOTSUP;
    case GRPC_STATUS_PERMISSION_DENIED: return DIST_EPERM;
    case GRPC_STATUS_UNAUTHENTICATED: return DIST_EAUTH;
    case GRPC_STATUS_CANCELLED: return DIST_ECANCELED;
    default: return DIST_EINTERNAL;
  }
}

void dist_status_details(const dist_errbuf *eb, char *buf, size_t len) {
  snprintf(buf, len, "%s: %s", dist_err_name(eb->code), dist_errbuf_msg(eb));
}

/* Details of the form "ENAME: message" come from a distd; anything else
 * (gRPC's own "Deadline Exceeded", "failed to connect ...") maps by code. */
int dist_status_parse(grpc_status_code code, const char *details,
                      dist_errbuf *eb) {
  const char *colon = details ? strstr(details, ": ") : NULL;
  int err = dist_err_from_grpc(code);
  if (colon && details[0] == 'E' && colon - details < 16) {
    char name[16];
    memcpy(name, details, (size_t)(colon - details));
    name[colon - details] = 0;
    int named = dist_err_from_name(name);
    if (named != DIST_EINTERNAL || strcmp(name, "EINTERNAL") == 0) {
      return dist_fail(eb, named, "%s", colon + 2);
    }
  }
  return dist_fail(eb, err, "%s", details && details[0] ? details
                                                        : dist_strerror(err));
}
