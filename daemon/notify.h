/* The systemd notify protocol, spoken directly: one datagram to the unix
 * socket named by $NOTIFY_SOCKET (abstract when it starts with '@'). Without
 * $NOTIFY_SOCKET every call is a no-op returning 0. */
#ifndef DISTD_NOTIFY_H
#define DISTD_NOTIFY_H

#include <stdint.h>

/* Sends state, e.g. "READY=1\nSTATUS=serving rank 0". Returns 0 or -1. */
int distd_notify(const char *state);
/* The watchdog interval from $WATCHDOG_USEC (0 when not asked for), in ms. */
int64_t distd_notify_watchdog_ms(void);

#endif
