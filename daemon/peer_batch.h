/* The system calls of one driver pass, made together (peer_internal.h's
 * driver): every socket's read and write of the pass goes into one
 * io_uring_enter instead of one system call each.
 *
 * Why: on these machines a system call costs 1.0-1.3 us, as much as
 * moving a few kilobytes, and a small collective is mostly system calls:
 * at W=4, three writes, a poll() and three reads per rank and phase
 * (barrier, then the op). The sockets stay non-blocking, so every call in
 * a batch runs at once, inside the io_uring_enter that submits it, and
 * returns what read(2) / sendmsg(2) would have (-EAGAIN included): the
 * batch changes how many times the kernel is entered, nothing else. A
 * batch of one call is made directly, which costs less.
 *
 * Where io_uring cannot be had (an old kernel, a seccomp profile that
 * refuses it, peer_io_uring = off) the same batch makes the calls one by
 * one, and distd_batch_cheap says so: the driver then reads only the
 * sockets poll() named, since each read is a system call of its own. */
#ifndef DISTD_PEER_BATCH_H
#define DISTD_PEER_BATCH_H

#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

typedef struct distd_batch distd_batch;

/* Room for `calls` calls per batch, each of up to `max_iov` pieces. With
 * use_uring, io_uring is tried first; *why (when not NULL) then says why
 * it could not be used, or is "". NULL only when out of memory. */
distd_batch *distd_batch_new(int calls, int max_iov, int use_uring, const char **why);
void distd_batch_free(distd_batch *b); /* NULL is a no-op */

/* 1 when a batch costs one system call whatever it holds (io_uring). */
int distd_batch_cheap(const distd_batch *b);

typedef enum { DISTD_BATCH_READ, DISTD_BATCH_WRITE } distd_batch_dir;

/* Adds a non-blocking read of fd into iov (as readv) or write of iov to
 * it (as sendmsg, MSG_NOSIGNAL); returns its index in the batch, or -1
 * when the batch is full or iovcnt exceeds max_iov. iov is copied. */
int distd_batch_add(distd_batch *b, distd_batch_dir dir, int fd, const struct iovec *iov,
                    int iovcnt);

/* Makes every call added since the last run, then empties the batch.
 * res[i] is call i's result: bytes moved, 0 at the end of a stream, or
 * -errno. Returns how many calls were made. */
int distd_batch_run(distd_batch *b, ssize_t *res);

#endif
