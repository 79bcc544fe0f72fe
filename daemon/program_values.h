/* Local values in and out of a LocalLayer request (program.proto): the
 * arguments an invocation binds to its program's inputs, and the values a
 * reply carries back. */
#ifndef DISTD_PROGRAM_VALUES_H
#define DISTD_PROGRAM_VALUES_H

#include "program.h"
#include "program.pb-c.h"
#include "program_registry.h"
#include "server.h"

/* A VALUE argument's bytes as a value, checked against its dtype and shape. */
int distd_value_from_arg(const Dist__V1__ProgramArg *a, distd_tval **out, dist_errbuf *eb);
/* The local piece of a stored tensor as a value; origin (may be NULL)
 * remembers where it came from. */
int distd_value_from_tensor(distd_server *s, const char *name, distd_tval **out,
                            distd_input_origin *origin, dist_errbuf *eb);
/* One value per program input (vals[i], NULL for RANK / COORD inputs,
 * which the engine fills in), and where each tensor came from. */
int distd_bind_args(distd_server *s, const Dist__V1__Program *pb,
                    Dist__V1__ProgramArg *const *args, size_t n_args, distd_tval **vals,
                    distd_input_origin *origins, dist_errbuf *eb);

/* The values a reply carries, pointing into the values themselves until
 * the reply is packed. */
typedef struct distd_value_set {
  size_t n;
  Dist__V1__ProgramValue *v;
  Dist__V1__ProgramValue **ptrs;
  uint64_t (*shapes)[DIST_MAX_DIMS];
} distd_value_set;

/* 0, or -1 without memory (then the set is empty, and free to free). */
int distd_values_init(distd_value_set *vs, size_t n);
/* Entry i describes t (borrowed until the reply is packed); NULL: empty. */
void distd_values_set(distd_value_set *vs, size_t i, const distd_tval *t);
void distd_values_free(distd_value_set *vs);

#endif
