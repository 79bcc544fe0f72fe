#include "random.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

/* Where getrandom(2) is missing (ENOSYS) or a sandbox's filter refuses it
 * (EPERM), the same bits from /dev/urandom; 0 or errno. */
static int from_urandom(char *buf, size_t n) {
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  size_t got = 0;
  int err = 0;
  while (got < n && !err) {
    ssize_t k = read(fd, buf + got, n - got);
    if (k > 0) got += (size_t)k;
    else if (k == 0) err = EIO;
    else if (errno != EINTR) err = errno;
  }
  close(fd);
  return err;
}

int dist_random_bytes(void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = getrandom((char *)buf + got, n - got, 0);
    if (k > 0) got += (size_t)k;
    else if (k < 0 && (errno == ENOSYS || errno == EPERM))
      return from_urandom((char *)buf + got, n - got);
    else if (k < 0 && errno != EINTR) return errno;
  }
  return 0;
}
