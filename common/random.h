/* Random bits from the kernel, for ids that must differ between processes
 * (and between pid namespaces, where pids repeat): not for keys. */
#ifndef DIST_RANDOM_H
#define DIST_RANDOM_H

#include <stddef.h>

/* Fills buf with n random bytes (getrandom(2), retried after a signal or
 * a short read; /dev/urandom where getrandom is missing or refused); 0, or
 * the errno that stopped it. */
int dist_random_bytes(void *buf, size_t n);

#endif
