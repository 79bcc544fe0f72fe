/* The daemon's cpu_affinity setting: pins the whole process to a CPU list
 * such as "0", "0-3" or "0,2-3" (the syntax of taskset -c and of
 * /proc/PID/status's Cpus_allowed_list). Several daemons sharing a few
 * cores run faster each kept on its own core: a daemon's threads hand work
 * to each other on one core, and the scheduler stops moving them. */
#ifndef DISTD_AFFINITY_H
#define DISTD_AFFINITY_H

#include <sched.h>

#include "errbuf.h"

/* Parses a CPU list into set; the message names what is wrong. */
int distd_cpu_list_parse(const char *text, cpu_set_t *set, dist_errbuf *eb);
/* Pins every thread of this process, those already running too (OpenBLAS
 * starts its pool before main), to the CPUs of text; threads started later
 * inherit it from the calling thread. Every CPU must be one the process may
 * use now. "" leaves the affinity as it is. */
int distd_pin_process(const char *text, dist_errbuf *eb);

#endif
