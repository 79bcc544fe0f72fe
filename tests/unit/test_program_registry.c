/* The registry's reserved places (program_registry.h): an invocation's
 * place is taken before the daemons vote on storing its outputs, so that a
 * full table refuses the invocation everywhere instead of failing it on one
 * daemon after the others stored. */
#include <criterion/criterion.h>
#include <string.h>

#include "program.h"
#include "program_build.h"
#include "program_registry.h"

#define F64 DIST__V1__DTYPE__FLOAT64
#define KIND(k) DIST__V1__PROGRAM_INPUT__KIND__##k
#define OP(o) DIST__V1__OP_KIND__OP_##o

static distd_program_registry *reg;
static uint64_t handle;
static distd_program *prog;

/* A registry with one program, y = sum(x). */
static void setup(void) {
  pb_build b;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  pbb_init(&b);
  uint32_t x = pbb_input(&b, KIND(DTENSOR_LOCAL), F64);
  pbb_output(&b, pbb_node(&b, OP(SUM), x, PB_END));
  cr_assert_eq(distd_program_new(&b.prog, &prog, &eb), 0, "%s", eb.msg);
  pbb_free(&b);
  reg = distd_registry_new(0);
  cr_assert_eq(distd_registry_add(reg, distd_program_ref(prog), 0, &handle, &eb), 0);
}

static void teardown(void) {
  distd_registry_free(reg);
  distd_program_free(prog);
}

TestSuite(registry, .init = setup, .fini = teardown);

/* An invocation of the program, as Invoke leaves it. */
static distd_invocation *run_once(void) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  dist_shape s = {1, {3}};
  distd_tval *x = NULL;
  cr_assert_eq(distd_tval_new(DIST_FLOAT64, &s, &x, &eb), 0, "%s", eb.msg);
  distd_tval *inputs[1] = {x};
  distd_run_env env = {0};
  distd_invocation *inv = NULL;
  cr_assert_eq(distd_program_run(prog, &env, inputs, &inv, &eb), 0, "%s", eb.msg);
  distd_tval_unref(x);
  return inv;
}

static int reserve(uint64_t id, dist_errbuf *eb) {
  distd_kept_invocation *k = calloc(1, sizeof *k);
  k->id = id;
  k->handle = handle;
  return distd_registry_keep(reg, k, eb);
}

Test(registry, a_reserved_place_is_handed_over_only_once_filled) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(reserve(7, &eb), 0, "%s", eb.msg);
  cr_assert_eq(distd_registry_live(reg), 1);
  distd_kept_invocation *k = NULL;
  cr_assert_eq(distd_registry_take(reg, 7, &k, &eb), DIST_ENOTFOUND);
  cr_assert_null(k);
  cr_assert_eq(reserve(7, &eb), DIST_EEXIST, "the id is taken by the reservation");
  distd_invocation *inv = run_once();
  distd_registry_fill(reg, 7, inv, calloc(1, sizeof(distd_input_origin)));
  cr_assert_eq(distd_registry_take(reg, 7, &k, &eb), 0, "%s", eb.msg);
  cr_assert_eq(k->inv, inv);
  cr_assert_eq(distd_registry_live(reg), 0);
  distd_kept_invocation_free(k);
}

/* The vote said no: the place is given up, and the table is as before. */
Test(registry, a_reservation_given_up_frees_its_place) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(reserve(7, &eb), 0, "%s", eb.msg);
  cr_assert_eq(distd_registry_release(reg, 7, &eb), 0, "%s", eb.msg);
  cr_assert_eq(distd_registry_live(reg), 0);
  cr_assert_eq(reserve(7, &eb), 0, "%s", eb.msg);
  cr_assert_eq(distd_registry_live(reg), 1);
}

Test(registry, reservations_count_against_the_limit) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  for (uint64_t id = 1; id <= DISTD_MAX_INVOCATIONS; id++)
    cr_assert_eq(reserve(id, &eb), 0, "%s", eb.msg);
  cr_assert_eq(reserve(DISTD_MAX_INVOCATIONS + 1, &eb), DIST_ENOMEM);
  cr_assert(strstr(eb.msg, "(the limit)"), "%s", eb.msg);
}

/* The program was released while the daemons voted: the invocation that
 * comes to fill the place is freed (the sanitizers check that it is). */
Test(registry, a_place_whose_program_is_gone_frees_what_comes_to_fill_it) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(reserve(7, &eb), 0, "%s", eb.msg);
  cr_assert_eq(distd_registry_remove(reg, handle, &eb), 0, "%s", eb.msg);
  cr_assert_eq(distd_registry_live(reg), 0);
  distd_registry_fill(reg, 7, run_once(), calloc(1, sizeof(distd_input_origin)));
  distd_kept_invocation *k = NULL;
  cr_assert_eq(distd_registry_take(reg, 7, &k, &eb), DIST_ENOTFOUND);
}
