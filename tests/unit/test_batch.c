/* The driver's batch of system calls (daemon/peer_batch.c): what each call
 * returns must be what read(2) / sendmsg(2) return on the same sockets,
 * with io_uring and without it. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "peer_batch.h"

/* A connected pair of non-blocking stream sockets, as the peers' are. */
static void stream_pair(int sv[2]) {
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(fcntl(sv[i], F_SETFL, fcntl(sv[i], F_GETFL) | O_NONBLOCK), 0);
}

static distd_batch *new_batch(int use_uring, int calls) {
  const char *why = NULL;
  distd_batch *b = distd_batch_new(calls, 4, use_uring, &why);
  cr_assert(b);
  cr_assert(why);
  if (!use_uring) cr_assert_eq(distd_batch_cheap(b), 0, "turned off, yet io_uring");
  if (use_uring && !distd_batch_cheap(b))
    cr_log_warn("io_uring is not available here (%s): only the plain calls are tested", why);
  return b;
}

ParameterizedTestParameters(batch, calls_return_what_the_system_calls_would) {
  static int modes[] = {1, 0};
  return cr_make_param_array(int, modes, 2);
}

/* Writes on two sockets, a read that finds bytes, a read that finds
 * none, and a read of a closed stream, all in one batch. */
ParameterizedTest(int *use_uring, batch, calls_return_what_the_system_calls_would) {
  int a[2], b2[2], c[2];
  stream_pair(a), stream_pair(b2), stream_pair(c);
  cr_assert_eq(write(a[1], "ready", 5), 5);
  close(c[1]);
  distd_batch *b = new_batch(*use_uring, 8);
  char in_a[16] = {0}, in_b[16] = {0}, in_c[4];
  const char hdr[] = "he", body[] = "llo";
  struct iovec w1[2] = {{(void *)hdr, 2}, {(void *)body, 3}};
  struct iovec w2[1] = {{(void *)"xyz", 3}};
  struct iovec r_a = {in_a, sizeof in_a}, r_b = {in_b, sizeof in_b}, r_c = {in_c, 4};
  cr_assert_eq(distd_batch_add(b, DISTD_BATCH_WRITE, b2[0], w1, 2), 0);
  cr_assert_eq(distd_batch_add(b, DISTD_BATCH_WRITE, c[0], w2, 1), 1); /* peer closed: EPIPE */
  cr_assert_eq(distd_batch_add(b, DISTD_BATCH_READ, a[0], &r_a, 1), 2);
  cr_assert_eq(distd_batch_add(b, DISTD_BATCH_READ, a[1], &r_b, 1), 3); /* nothing to read */
  cr_assert_eq(distd_batch_add(b, DISTD_BATCH_READ, c[0], &r_c, 1), 4); /* end of stream */
  ssize_t res[8];
  cr_assert_eq(distd_batch_run(b, res), 5);
  cr_assert_eq(res[0], 5);
  cr_assert_eq(res[1], -EPIPE);
  cr_assert_eq(res[2], 5);
  cr_assert_str_eq(in_a, "ready");
  cr_assert_eq(res[3], -EAGAIN);
  cr_assert_eq(res[4], 0);
  /* what the first write sent arrives whole, in order */
  cr_assert_eq(read(b2[1], in_b, sizeof in_b), 5);
  cr_assert_eq(memcmp(in_b, "hello", 5), 0);
  /* the batch is empty again */
  cr_assert_eq(distd_batch_run(b, res), 0);
  distd_batch_free(b);
  int fds[] = {a[0], a[1], b2[0], b2[1], c[0]};
  for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++) close(fds[i]);
}

/* A read into three pieces fills them in order, as readv does. */
ParameterizedTestParameters(batch, a_scattered_read_fills_its_pieces_in_order) {
  static int modes[] = {1, 0};
  return cr_make_param_array(int, modes, 2);
}

ParameterizedTest(int *use_uring, batch, a_scattered_read_fills_its_pieces_in_order) {
  int s[2];
  stream_pair(s);
  cr_assert_eq(write(s[1], "0123456789", 10), 10);
  distd_batch *b = new_batch(*use_uring, 2);
  char x[3], y[4], z[8] = {0};
  struct iovec r[3] = {{x, 3}, {y, 4}, {z, 8}};
  struct iovec w = {(void *)"!", 1};
  cr_assert_eq(distd_batch_add(b, DISTD_BATCH_READ, s[0], r, 3), 0);
  cr_assert_eq(distd_batch_add(b, DISTD_BATCH_WRITE, s[0], &w, 1), 1); /* two calls: the ring */
  ssize_t res[2];
  cr_assert_eq(distd_batch_run(b, res), 2);
  cr_assert_eq(res[0], 10);
  cr_assert_eq(res[1], 1);
  cr_assert_eq(memcmp(x, "012", 3), 0);
  cr_assert_eq(memcmp(y, "3456", 4), 0);
  cr_assert_eq(memcmp(z, "789", 3), 0);
  distd_batch_free(b);
  close(s[0]);
  close(s[1]);
}

Test(batch, a_full_batch_or_too_many_pieces_is_refused) {
  int s[2];
  stream_pair(s);
  distd_batch *b = new_batch(1, 1);
  struct iovec v[5] = {{(void *)"a", 1}, {(void *)"b", 1}, {(void *)"c", 1},
                       {(void *)"d", 1}, {(void *)"e", 1}};
  cr_assert_eq(distd_batch_add(b, DISTD_BATCH_WRITE, s[0], v, 5), -1, "max_iov is 4");
  cr_assert_eq(distd_batch_add(b, DISTD_BATCH_WRITE, s[0], v, 0), -1, "no piece");
  cr_assert_eq(distd_batch_add(b, DISTD_BATCH_WRITE, s[0], v, 4), 0);
  cr_assert_eq(distd_batch_add(b, DISTD_BATCH_WRITE, s[0], v, 1), -1, "room for one call");
  ssize_t res[1];
  cr_assert_eq(distd_batch_run(b, res), 1);
  cr_assert_eq(res[0], 4);
  distd_batch_free(b);
  distd_batch_free(NULL);
  close(s[0]);
  close(s[1]);
}
