#include "random.h"

#include <errno.h>
#include <sys/random.h>

int dist_random_bytes(void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = getrandom((char *)buf + got, n - got, 0);
    if (k < 0 && errno != EINTR) return errno;
    if (k > 0) got += (size_t)k;
  }
  return 0;
}
