/* A token that tells this process apart from every other process using
 * the same daemons, for the names libdist makes up. Not installed. */
#ifndef DIST_CLIENT_PROCESS_TOKEN_H
#define DIST_CLIENT_PROCESS_TOKEN_H

#include "client_internal.h"

/* Hex digits in a token, without its terminating NUL. */
enum { DIST_PROCESS_TOKEN_LEN = 16 };

/* Copies this process's token (DIST_PROCESS_TOKEN_LEN hex digits and a
 * NUL) to out: 64 random bits from getrandom(2), taken at the first call
 * and again in a child after fork, the same for every thread. A pid is
 * not such a token: trainers in containers are often pid 1 each, and pids
 * are used again. 0, or the error recorded on c when the kernel gives no
 * random bits (DIST_EIO: neither getrandom nor /dev/urandom), naming why,
 * or the fork handler cannot be registered (DIST_ENOMEM). */
int dist_process_token(dist_client *c, char out[DIST_PROCESS_TOKEN_LEN + 1]);

#endif
