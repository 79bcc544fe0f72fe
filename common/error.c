#include <string.h>

#include "dist/error.h"

const char *dist_strerror(int err) {
  switch (err) {
#define DIST_ERROR_MSG(name, value, msg) \
  case value:                            \
    return msg;
    DIST_ERROR_MAP(DIST_ERROR_MSG)
#undef DIST_ERROR_MSG
  }
  return "unknown error";
}

const char *dist_err_name(int err) {
  switch (err) {
#define DIST_ERROR_NAME(name, value, msg) \
  case value:                             \
    return #name;
    DIST_ERROR_MAP(DIST_ERROR_NAME)
#undef DIST_ERROR_NAME
  }
  return "EUNKNOWN";
}

int dist_err_from_name(const char *name) {
#define DIST_ERROR_LOOKUP(ename, value, msg) \
  if (strcmp(name, #ename) == 0) return value;
  DIST_ERROR_MAP(DIST_ERROR_LOOKUP)
#undef DIST_ERROR_LOOKUP
  return DIST_EINTERNAL;
}
