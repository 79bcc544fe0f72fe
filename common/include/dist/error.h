/* The one list of distd error codes, shared by the daemon, libdist and
 * distctl. Each row gives the code's name, value and message; the same table
 * produces the enum, dist_strerror() and dist_err_name(), and the mapping to
 * gRPC status codes lives in exactly one function (common/status.c). */
#ifndef DIST_ERROR_H
#define DIST_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

#define DIST_ERROR_MAP(X)                                                     \
  X(OK, 0, "success")                                                         \
  X(EINVAL, -1, "invalid argument")                                           \
  X(ENOTFOUND, -2, "not found")                                               \
  X(EEXIST, -3, "already exists")                                             \
  X(ENOMEM, -4, "out of memory or over the memory limit")                     \
  X(EUNAVAIL, -5, "unavailable")                                              \
  X(ETIMEDOUT, -6, "deadline exceeded")                                       \
  X(EPEER, -7, "peer lost")                                                   \
  X(EPROTO, -8, "protocol error")                                             \
  X(EIO, -9, "input/output error")                                            \
  X(ENOTSUP, -10, "not implemented")                                          \
  X(EINTERNAL, -11, "internal error")                                         \
  X(EPERM, -12, "permission denied")                                          \
  X(EAUTH, -13, "unauthenticated")                                            \
  X(ECANCELED, -14, "cancelled")                                              \
  X(EMISMATCH, -15, "shape or dtype mismatch")                                \
  X(ECONFIG, -16, "bad configuration")                                        \
  X(ETOOBIG, -17, "too large")

typedef enum {
#define DIST_ERROR_ENUM(name, value, msg) DIST_##name = value,
  DIST_ERROR_MAP(DIST_ERROR_ENUM)
#undef DIST_ERROR_ENUM
} dist_err;

/* A static message for an error code; never NULL ("unknown error"). */
const char *dist_strerror(int err);

/* The code's name without prefix, e.g. "ENOTFOUND"; never NULL ("EUNKNOWN"). */
const char *dist_err_name(int err);

/* The code with that name (as dist_err_name prints it), or DIST_EINTERNAL. */
int dist_err_from_name(const char *name);

#ifdef __cplusplus
}
#endif
#endif
