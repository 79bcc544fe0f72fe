/* The programs a daemon has registered and the invocations it keeps for
 * backward. Thread-safe: one mutex guards the tables; an invocation taken
 * out for backward belongs to the taker alone, so the engine never sees two
 * threads on one invocation.
 *
 * Bounds: an invocation lives until it is taken (backward), released, its
 * program is unregistered, or its time-to-live (per program, set at
 * registration) runs out; at most DISTD_MAX_INVOCATIONS live at once. */
#ifndef DISTD_PROGRAM_REGISTRY_H
#define DISTD_PROGRAM_REGISTRY_H

#include <stdint.h>

#include "errbuf.h"
#include "mesh.h"
#include "program.h"

#define DISTD_MAX_INVOCATIONS 4096
#define DISTD_DEFAULT_INVOCATION_TTL 600.0 /* seconds */

typedef struct distd_program_registry distd_program_registry;

/* Where a DTENSOR_LOCAL input came from, so its gradient can be stored as a
 * distributed tensor of the same global shape on the same mesh. */
typedef struct distd_input_origin {
  int is_tensor;
  dist_dtype dtype;
  dist_shape global;
  dist_mesh_desc mesh;
  dist_placement placements[DIST_MAX_MESH_DIMS];
} distd_input_origin;

/* An invocation kept for backward. The registry owns it while it is in a
 * table; distd_registry_take hands it over. */
typedef struct distd_kept_invocation {
  uint64_t id;
  uint64_t handle;         /* the program it ran */
  double expires;          /* CLOCK_MONOTONIC seconds */
  distd_invocation *inv;
  distd_input_origin *origins; /* one per program input */
  struct distd_kept_invocation *next;
} distd_kept_invocation;

/* default_ttl <= 0: DISTD_DEFAULT_INVOCATION_TTL. */
distd_program_registry *distd_registry_new(double default_ttl);
/* Releases every program and invocation. NULL is a no-op. */
void distd_registry_free(distd_program_registry *r);

/* Adds p (the registry takes the reference) with an invocation ttl in
 * seconds (<= 0: the default); *handle is new and never 0. */
int distd_registry_add(distd_program_registry *r, distd_program *p,
                       double ttl, uint64_t *handle, dist_errbuf *eb);
/* A new reference to the program of handle, or DIST_ENOTFOUND. */
int distd_registry_get(distd_program_registry *r, uint64_t handle,
                       distd_program **out, dist_errbuf *eb);
/* Unregisters handle and releases its invocations. */
int distd_registry_remove(distd_program_registry *r, uint64_t handle,
                          dist_errbuf *eb);

/* Keeps k (taking ownership of it and its fields) under k->id; an id in use
 * or a full table is an error and k is then freed. Sets k->expires.
 *
 * k->inv may be NULL: the place is reserved, counted against the limit,
 * for an invocation that the daemons have yet to agree to store (its
 * outputs are stored by all of them or by none). distd_registry_fill puts
 * the invocation in; distd_registry_release gives the place up. */
int distd_registry_keep(distd_program_registry *r, distd_kept_invocation *k,
                        dist_errbuf *eb);
/* Puts inv and origins (taking them) into the place reserved under id;
 * frees them when the place is gone (its program was released meanwhile,
 * or it expired). Cannot fail. */
void distd_registry_fill(distd_program_registry *r, uint64_t id, distd_invocation *inv,
                         distd_input_origin *origins);
/* Removes invocation id and hands it over (free with
 * distd_kept_invocation_free), or DIST_ENOTFOUND with a message saying why
 * it may be gone (a reserved place is not handed over). */
int distd_registry_take(distd_program_registry *r, uint64_t id,
                        distd_kept_invocation **out, dist_errbuf *eb);
/* Takes and frees invocation id, or gives up its reserved place. */
int distd_registry_release(distd_program_registry *r, uint64_t id,
                           dist_errbuf *eb);
/* Live invocations (for tests and metrics). */
int distd_registry_live(distd_program_registry *r);

/* Frees k, its invocation and origins. NULL is a no-op. */
void distd_kept_invocation_free(distd_kept_invocation *k);

#endif
