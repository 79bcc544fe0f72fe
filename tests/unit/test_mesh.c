/* ProcessMesh, placements, the ceil(N/k) split rule and local boxes, against
 * hand-computed expectations (semantics.md: ProcessMesh, Placements). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "mesh.h"

/* ---- split rule -------------------------------------------------------- */

static void expect_split(int64_t n, int k, const int64_t *sizes) {
  int64_t start = 0;
  for (int i = 0; i < k; i++) {
    cr_expect_eq(dist_split_size(n, k, i), sizes[i], "%lld over %d, chunk %d", (long long)n, k, i);
    cr_expect_eq(dist_split_start(n, k, i), start, "%lld over %d, start %d", (long long)n, k, i);
    start += sizes[i];
  }
  cr_expect_eq(start, n);
}

Test(split, ten_over_4) { expect_split(10, 4, (int64_t[]){3, 3, 3, 1}); }
Test(split, thirteen_over_6) { expect_split(13, 6, (int64_t[]){3, 3, 3, 3, 1, 0}); }
Test(split, even_12_over_4) { expect_split(12, 4, (int64_t[]){3, 3, 3, 3}); }
Test(split, dim_smaller_than_mesh) { expect_split(2, 4, (int64_t[]){1, 1, 0, 0}); }
Test(split, zero_length_dim) { expect_split(0, 3, (int64_t[]){0, 0, 0}); }
Test(split, one_rank_holds_everything) { expect_split(7, 1, (int64_t[]){7}); }

/* ---- mesh -------------------------------------------------------------- */

static dist_mesh_desc mesh_of(const char *text, const char *names) {
  dist_mesh_desc m;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_mesh_parse(&m, text, names, &eb), 0, "%s: %s", text, eb.msg);
  return m;
}

Test(mesh, parse_1d_default_names) {
  dist_mesh_desc m = mesh_of("[0,1]", NULL);
  cr_expect_eq(m.ndim, 1);
  cr_expect_eq(m.shape[0], 2);
  cr_expect_eq(m.nranks, 2);
  cr_expect_str_eq(m.dim_names[0], "d0");
  dist_mesh_desc e = mesh_of("[[0,1],[2,3]]", "");
  cr_expect_str_eq(e.dim_names[1], "d1");
}

/* An exchange's output lives on the mesh of the daemon that made it. */
Test(mesh, one_rank_mesh_equals_its_parsed_form) {
  dist_mesh_desc m;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_mesh_of_rank(&m, 3, &eb), 0, "%s", eb.msg);
  dist_mesh_desc parsed = mesh_of("[3]", NULL);
  cr_expect(dist_mesh_equal(&m, &parsed));
  cr_expect_eq(dist_mesh_index_of(&m, 3), 0);
  cr_expect_eq(dist_mesh_of_rank(&m, -1, &eb), DIST_EINVAL);
}

Test(mesh, parse_2d_with_names_and_format) {
  dist_mesh_desc m = mesh_of(" [ [4, 6 ,8],\n [5,7,9] ] ", "dp, mp");
  cr_expect_eq(m.ndim, 2);
  cr_expect_eq(m.shape[0], 2);
  cr_expect_eq(m.shape[1], 3);
  int want[] = {4, 6, 8, 5, 7, 9};
  cr_expect_arr_eq(m.ranks, want, sizeof want);
  cr_expect_str_eq(m.dim_names[0], "dp");
  cr_expect_str_eq(m.dim_names[1], "mp");
  char buf[128];
  dist_mesh_format(&m, buf, sizeof buf);
  cr_expect_str_eq(buf, "[[4, 6, 8], [5, 7, 9]]");
  dist_mesh_desc again = mesh_of(buf, "dp,mp");
  cr_expect(dist_mesh_equal(&m, &again));
}

Test(mesh, parse_3d) {
  dist_mesh_desc m = mesh_of("[[[0,1],[2,3]],[[4,5],[6,7]]]", NULL);
  cr_expect_eq(m.ndim, 3);
  cr_expect_eq(m.shape[0] * 100 + m.shape[1] * 10 + m.shape[2], 222);
  cr_expect_str_eq(m.dim_names[2], "d2");
}

Test(mesh, parse_errors_name_the_problem) {
  static const struct {
    const char *text, *names, *needle;
  } cases[] = {
      {"[0,1,3,3]", NULL, "rank 3 appears twice"},
      {"[[0,1],[2]]", NULL, "ragged"},
      {"[[0,1],2]", NULL, "ragged"},
      {"[0,[1,2]]", NULL, "ragged"},
      {"[[0,1],[2,3],[4,5,6]]", NULL, "ragged"},
      {"[]", NULL, "empty"},
      {"[[]]", NULL, "empty"},
      {"[0,1", NULL, "expected ',' or ']'"},
      {"[0,1]]", NULL, "trailing"},
      {"[0,-1]", NULL, "expected a rank"},
      {"0,1", NULL, "not a list"},
      {"", NULL, "not a list"},
      {"[[0,1],[2,3]]", "dp", "1 dim names given for a 2-d mesh"},
      {"[0,1]", "dp,mp", "2 dim names given for a 1-d mesh"},
      {"[[0,1],[2,3]]", "dp,dp", "'dp' appears twice"},
      {"[[0,1],[2,3]]", "dp,", "empty name"},
      {"[[0,1],[2,3]]", "dp,donn\xe9" "es", "the name of dim 1 is not valid UTF-8"},
      {"[[[[[[[[[0]]]]]]]]]", NULL, "deeper than 8"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    dist_mesh_desc m;
    dist_errbuf eb = DIST_ERRBUF_INIT;
    cr_expect_eq(dist_mesh_parse(&m, cases[i].text, cases[i].names, &eb), DIST_EINVAL, "'%s'",
                 cases[i].text);
    cr_expect(strstr(eb.msg, cases[i].needle) != NULL, "'%s': message '%s' lacks '%s'", cases[i].text,
              eb.msg, cases[i].needle);
  }
}

Test(mesh, init_checks_shape_and_rank_count) {
  dist_mesh_desc m;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_expect_eq(dist_mesh_init(&m, 2, (int[]){2, 0}, (int[]){0}, NULL, &eb), DIST_EINVAL);
  cr_expect(strstr(eb.msg, "dim 1 has size 0") != NULL, "%s", eb.msg);
  cr_expect_eq(dist_mesh_init(&m, 2, (int[]){64, 64}, (int[]){0}, NULL, &eb), DIST_EINVAL);
  cr_expect(strstr(eb.msg, "more than 1024 ranks") != NULL, "%s", eb.msg);
  cr_expect_eq(dist_mesh_init(&m, 9, (int[]){1, 1, 1, 1, 1, 1, 1, 1, 1}, (int[]){0}, NULL, &eb),
               DIST_EINVAL);
  cr_expect_eq(dist_mesh_init(&m, 1, (int[]){3}, (int[]){0, 2, 0}, NULL, &eb), DIST_EINVAL);
  cr_expect(strstr(eb.msg, "rank 0 appears twice") != NULL, "%s", eb.msg);
}

Test(mesh, equal_compares_shape_ranks_and_names) {
  dist_mesh_desc a = mesh_of("[[0,1],[2,3]]", "dp,mp");
  dist_mesh_desc b = mesh_of("[[0,1],[2,3]]", "x,y");
  dist_mesh_desc c = mesh_of("[[0,2],[1,3]]", "dp,mp");
  dist_mesh_desc d = mesh_of("[0,1,2,3]", NULL);
  cr_expect(dist_mesh_equal(&a, &a));
  cr_expect_not(dist_mesh_equal(&a, &b));
  cr_expect_not(dist_mesh_equal(&a, &c));
  cr_expect(dist_mesh_same_shape(&a, &c));
  cr_expect_not(dist_mesh_same_shape(&a, &d));
}

Test(mesh, coords_and_groups_2d) {
  /* [[0,1,2],[3,4,5]] with names dp (rows) and mp (columns). */
  dist_mesh_desc m = mesh_of("[[10,11,12],[13,14,15]]", "dp,mp");
  cr_expect_eq(dist_mesh_index_of(&m, 14), 4);
  cr_expect_eq(dist_mesh_index_of(&m, 3), -1);
  int c[2];
  dist_mesh_coords(&m, 4, c);
  cr_expect_eq(c[0], 1);
  cr_expect_eq(c[1], 1);
  dist_mesh_coords(&m, 2, c);
  cr_expect_eq(c[0], 0);
  cr_expect_eq(c[1], 2);
  int g[8];
  cr_assert_eq(dist_mesh_group(&m, 14, 0, g), 2);
  cr_expect_arr_eq(g, ((int[]){11, 14}), 2 * sizeof(int));
  cr_assert_eq(dist_mesh_group(&m, 14, 1, g), 3);
  cr_expect_arr_eq(g, ((int[]){13, 14, 15}), 3 * sizeof(int));
  cr_assert_eq(dist_mesh_group(&m, 12, 0, g), 2);
  cr_expect_arr_eq(g, ((int[]){12, 15}), 2 * sizeof(int));
  cr_expect_eq(dist_mesh_group(&m, 99, 0, g), -1);
  cr_expect_eq(dist_mesh_group(&m, 10, 2, g), -1);
}

/* Groups over several dims: the reduction of a Partial on all of them. */
Test(mesh, group_over_several_dims) {
  dist_mesh_desc m = mesh_of("[[[0,1],[2,3],[4,5]],[[6,7],[8,9],[10,11]]]", NULL);
  int g[12];
  cr_assert_eq(dist_mesh_group_dims(&m, 9, 0x7, g), 12);
  for (int i = 0; i < 12; i++) cr_expect_eq(g[i], i);
  cr_assert_eq(dist_mesh_group_dims(&m, 9, 0x5, g), 4); /* dims 0 and 2 */
  cr_expect_arr_eq(g, ((int[]){2, 3, 8, 9}), 4 * sizeof(int));
  cr_assert_eq(dist_mesh_group_dims(&m, 9, 0x6, g), 6); /* dims 1 and 2 */
  cr_expect_arr_eq(g, ((int[]){6, 7, 8, 9, 10, 11}), 6 * sizeof(int));
  cr_assert_eq(dist_mesh_group_dims(&m, 9, 0, g), 1);
  cr_expect_eq(g[0], 9);
  cr_expect_eq(dist_mesh_group_dims(&m, 12, 0x1, g), -1);
}

Test(mesh, submesh_by_dim_name) {
  dist_mesh_desc m = mesh_of("[[0,1,2],[3,4,5]]", "dp,mp"), s;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  char buf[64];
  cr_assert_eq(dist_mesh_submesh(&m, "dp", 1, &s, &eb), 0, "%s", eb.msg);
  dist_mesh_format(&s, buf, sizeof buf);
  cr_expect_str_eq(buf, "[3, 4, 5]");
  cr_expect_str_eq(s.dim_names[0], "mp");
  cr_assert_eq(dist_mesh_submesh(&m, "mp", 2, &s, &eb), 0, "%s", eb.msg);
  dist_mesh_format(&s, buf, sizeof buf);
  cr_expect_str_eq(buf, "[2, 5]");
  cr_expect_str_eq(s.dim_names[0], "dp");
  cr_expect_eq(dist_mesh_submesh(&m, "pp", 0, &s, &eb), DIST_ENOTFOUND);
  cr_expect(strstr(eb.msg, "'pp'") != NULL);
  cr_expect_eq(dist_mesh_submesh(&m, "mp", 3, &s, &eb), DIST_EINVAL);
  cr_expect(strstr(eb.msg, "index 3") != NULL);
  /* In place, and down to a single rank. */
  cr_assert_eq(dist_mesh_submesh(&m, "dp", 0, &m, &eb), 0);
  dist_mesh_format(&m, buf, sizeof buf);
  cr_expect_str_eq(buf, "[0, 1, 2]");
  cr_expect_str_eq(m.dim_names[0], "mp");
  cr_assert_eq(dist_mesh_submesh(&m, "mp", 1, &s, &eb), 0);
  cr_expect_eq(s.ndim, 0);
  cr_expect_eq(s.nranks, 1);
  cr_expect_eq(s.ranks[0], 1);
}

/* ---- placements -------------------------------------------------------- */

Test(placements, parse_and_format) {
  dist_placement p[8];
  int n = 0;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  cr_assert_eq(dist_placements_parse("Shard(0),Replicate(),Partial(max)", p, 8, &n, &eb), 0, "%s",
               eb.msg);
  cr_assert_eq(n, 3);
  cr_expect_eq(p[0].kind, DIST_SHARD);
  cr_expect_eq(p[0].dim, 0);
  cr_expect_eq(p[1].kind, DIST_REPLICATE);
  cr_expect_eq(p[2].kind, DIST_PARTIAL);
  cr_expect_eq(p[2].reduce, DIST_REDUCE_MAX);
  char buf[128];
  dist_placements_text(p, n, buf, sizeof buf);
  cr_expect_str_eq(buf, "[Shard(0), Replicate(), Partial(max)]");
  /* The printed form, spaces and Paddle's keyword spelling parse too. */
  cr_assert_eq(dist_placements_parse(buf, p, 8, &n, &eb), 0, "%s", eb.msg);
  cr_expect_eq(n, 3);
  cr_assert_eq(dist_placements_parse(" Partial( ) , Shard( dim = 1 ) ", p, 8, &n, &eb), 0, "%s",
               eb.msg);
  cr_expect_eq(n, 2);
  cr_expect_eq(p[0].kind, DIST_PARTIAL);
  cr_expect_eq(p[0].reduce, DIST_REDUCE_SUM);
  cr_expect_eq(p[1].dim, 1);
  cr_assert_eq(dist_placements_parse("[]", p, 8, &n, &eb), 0);
  cr_expect_eq(n, 0);
}

Test(placements, every_reduce_name) {
  const char *names[] = {"sum", "max", "min", "prod", "avg", "any", "all"};
  for (int i = 0; i < 7; i++) {
    dist_reduce r;
    cr_assert_eq(dist_reduce_parse(names[i], &r), 0);
    cr_expect_str_eq(dist_reduce_name(r), names[i]);
    char text[32];
    snprintf(text, sizeof text, "Partial(%s)", names[i]);
    dist_placement p;
    int n;
    cr_assert_eq(dist_placements_parse(text, &p, 1, &n, NULL), 0, "%s", text);
    cr_expect_eq(p.reduce, r);
  }
  dist_reduce r;
  cr_expect_eq(dist_reduce_parse("mean", &r), DIST_EINVAL);
  cr_expect_str_eq(dist_reduce_name((dist_reduce)99), "invalid");
}

Test(placements, parse_errors) {
  static const struct {
    const char *text, *needle;
  } cases[] = {
      {"Shard()", "Shard needs"},        {"Shard(x)", "Shard needs"},
      {"Shard(-1)", "Shard needs"},      {"Partial(mean)", "Partial(mean): unknown reduce"},
      {"Replicate", "expected Shard"},   {"Replicate(0)", "expected ')'"},
      {"Split(0)", "unknown placement 'Split'"}, {"[Shard(0)", "missing ']'"},
      {"Shard(0) Shard(1)", "unexpected"},       {"Shard(0),,Shard(1)", "expected Shard"},
      {"Shard(0),Shard(1),Shard(2)", "more than 2 given"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    dist_placement p[2];
    int n;
    dist_errbuf eb = DIST_ERRBUF_INIT;
    cr_expect_eq(dist_placements_parse(cases[i].text, p, 2, &n, &eb), DIST_EINVAL, "'%s'",
                 cases[i].text);
    cr_expect(strstr(eb.msg, cases[i].needle) != NULL, "'%s': message '%s' lacks '%s'", cases[i].text,
              eb.msg, cases[i].needle);
  }
}

Test(placements, check_messages) {
  dist_mesh_desc m = mesh_of("[[0,1],[2,3]]", NULL);
  dist_errbuf eb = DIST_ERRBUF_INIT;
  dist_placement one[1] = {DIST_SHARD_DIM(0)};
  cr_expect_eq(dist_placements_check(&m, one, 1, 2, &eb), DIST_EINVAL);
  cr_expect_str_eq(eb.msg, "placements: 1 given, mesh has 2 dims");
  dist_placement two[2] = {DIST_REPLICATED, DIST_SHARD_DIM(3)};
  cr_expect_eq(dist_placements_check(&m, two, 2, 2, &eb), DIST_EINVAL);
  cr_expect_str_eq(eb.msg, "Shard(3): tensor has 2 dims");
  dist_placement ok[2] = {DIST_PARTIAL_OF(DIST_REDUCE_AVG), DIST_SHARD_DIM(1)};
  cr_expect_eq(dist_placements_check(&m, ok, 2, 2, &eb), 0);
  dist_placement bad[2] = {DIST_PARTIAL_OF((dist_reduce)17), DIST_SHARD_DIM(1)};
  cr_expect_eq(dist_placements_check(&m, bad, 2, 2, &eb), DIST_EINVAL);
}

/* ---- local boxes ------------------------------------------------------- */

static void expect_box(const dist_mesh_desc *m, const dist_placement *p, dist_shape global,
                       const int *coords, dist_shape want, const int64_t *want_off) {
  dist_shape local;
  int64_t off[DIST_MAX_DIMS];
  dist_local_box(m, p, &global, coords, &local, off);
  char got_s[64], want_s[64];
  dist_shape_format(&local, got_s, sizeof got_s);
  dist_shape_format(&want, want_s, sizeof want_s);
  cr_expect(dist_shape_equal(&local, &want), "coords (%d, %d): shape %s, want %s", coords[0],
            m->ndim > 1 ? coords[1] : 0, got_s, want_s);
  for (int d = 0; d < global.ndim; d++)
    cr_expect_eq(off[d], want_off[d], "coords (%d, %d) dim %d offset", coords[0],
                 m->ndim > 1 ? coords[1] : 0, d);
}

Test(local_box, shard_10_over_4) {
  dist_mesh_desc m = mesh_of("[0,1,2,3]", NULL);
  dist_placement p[1] = {DIST_SHARD_DIM(0)};
  dist_shape g = {2, {10, 3}};
  expect_box(&m, p, g, (int[]){0}, (dist_shape){2, {3, 3}}, (int64_t[]){0, 0});
  expect_box(&m, p, g, (int[]){2}, (dist_shape){2, {3, 3}}, (int64_t[]){6, 0});
  expect_box(&m, p, g, (int[]){3}, (dist_shape){2, {1, 3}}, (int64_t[]){9, 0});
}

Test(local_box, replicate_and_partial_hold_everything) {
  dist_mesh_desc m = mesh_of("[[0,1],[2,3]]", NULL);
  dist_placement p[2] = {DIST_REPLICATED, DIST_PARTIAL_OF(DIST_REDUCE_SUM)};
  expect_box(&m, p, (dist_shape){2, {5, 7}}, (int[]){1, 1}, (dist_shape){2, {5, 7}},
             (int64_t[]){0, 0});
}

Test(local_box, two_mesh_dims_on_two_tensor_dims) {
  /* 2x3 mesh, [Shard(0), Shard(1)] over [5, 7]: rows 3,2; columns 3,3,1. */
  dist_mesh_desc m = mesh_of("[[0,1,2],[3,4,5]]", NULL);
  dist_placement p[2] = {DIST_SHARD_DIM(0), DIST_SHARD_DIM(1)};
  dist_shape g = {2, {5, 7}};
  expect_box(&m, p, g, (int[]){0, 0}, (dist_shape){2, {3, 3}}, (int64_t[]){0, 0});
  expect_box(&m, p, g, (int[]){1, 2}, (dist_shape){2, {2, 1}}, (int64_t[]){3, 6});
  expect_box(&m, p, g, (int[]){1, 1}, (dist_shape){2, {2, 3}}, (int64_t[]){3, 3});
}

Test(local_box, nested_shard_of_one_tensor_dim) {
  /* 2x3 mesh, [Shard(0), Shard(0)] over [13, 4]: mesh dim 0 cuts 13 into
   * 7 | 6; mesh dim 1 cuts 7 into 3,3,1 and 6 into 2,2,2. */
  dist_mesh_desc m = mesh_of("[[0,1,2],[3,4,5]]", NULL);
  dist_placement p[2] = {DIST_SHARD_DIM(0), DIST_SHARD_DIM(0)};
  dist_shape g = {2, {13, 4}};
  const int64_t want_size[2][3] = {{3, 3, 1}, {2, 2, 2}};
  const int64_t want_off[2][3] = {{0, 3, 6}, {7, 9, 11}};
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++)
      expect_box(&m, p, g, (int[]){i, j}, (dist_shape){2, {want_size[i][j], 4}},
                 (int64_t[]){want_off[i][j], 0});
}

Test(local_box, nested_shard_leaves_empty_pieces) {
  /* [3] over a 2x2 mesh, both dims sharding dim 0: 2 | 1, then 1,1 | 1,0. */
  dist_mesh_desc m = mesh_of("[[0,1],[2,3]]", NULL);
  dist_placement p[2] = {DIST_SHARD_DIM(0), DIST_SHARD_DIM(0)};
  dist_shape g = {1, {3}};
  expect_box(&m, p, g, (int[]){0, 0}, (dist_shape){1, {1}}, (int64_t[]){0});
  expect_box(&m, p, g, (int[]){0, 1}, (dist_shape){1, {1}}, (int64_t[]){1});
  expect_box(&m, p, g, (int[]){1, 0}, (dist_shape){1, {1}}, (int64_t[]){2});
  expect_box(&m, p, g, (int[]){1, 1}, (dist_shape){1, {0}}, (int64_t[]){3});
}

/* Whatever the placements, each element is held by exactly as many ranks as
 * the product of the non-shard mesh dims' sizes. */
Test(local_box, pieces_tile_the_tensor) {
  dist_mesh_desc m = mesh_of("[[0,1,2],[3,4,5]]", NULL);
  const dist_placement choices[] = {DIST_SHARD_DIM(0), DIST_SHARD_DIM(1), DIST_REPLICATED};
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 3; b++) {
      dist_placement p[2] = {choices[a], choices[b]};
      int copies = (a == 2 ? 2 : 1) * (b == 2 ? 3 : 1);
      for (int64_t r = 0; r < 8; r++)
        for (int64_t c = 0; c < 8; c++) {
          int count[8][8] = {{0}};
          dist_shape g = {2, {r, c}};
          for (int idx = 0; idx < m.nranks; idx++) {
            int coords[2];
            dist_shape local;
            int64_t off[2];
            dist_mesh_coords(&m, idx, coords);
            dist_local_box(&m, p, &g, coords, &local, off);
            for (int64_t i = 0; i < local.dims[0]; i++)
              for (int64_t j = 0; j < local.dims[1]; j++) count[off[0] + i][off[1] + j]++;
          }
          for (int64_t i = 0; i < r; i++)
            for (int64_t j = 0; j < c; j++)
              cr_assert_eq(count[i][j], copies, "placements %d,%d shape [%lld, %lld] elem (%lld, %lld)",
                           a, b, (long long)r, (long long)c, (long long)i, (long long)j);
        }
    }
}

Test(placements, partial_dim_is_the_first_partial_mesh_dim) {
  dist_placement p[4];
  int np = 0;
  cr_assert_eq(dist_placements_parse("Shard(0),Replicate()", p, 4, &np, NULL), 0);
  cr_assert_eq(dist_placements_partial_dim(p, np), -1);
  cr_assert_eq(dist_placements_parse("Replicate(),Partial(max),Partial(sum)", p, 4, &np, NULL), 0);
  cr_assert_eq(dist_placements_partial_dim(p, np), 1);
  cr_assert_eq(dist_placements_partial_dim(p, 1), -1); /* only the first np count */
}

/* ---- dtensor_from_local: the global shape of local pieces --------------- */

static dist_shape shape2(int64_t a, int64_t b) { return (dist_shape){2, {a, b}}; }

/* [[0,1],[2,3]] with Shard(0) on the first mesh dim and Shard(1) on the
 * second: a [10, 5] tensor is held as rows 5/5 and columns 3/2. */
Test(pieces, a_2x2_mesh_sums_each_sharded_dim_along_its_axis) {
  dist_mesh_desc m = mesh_of("[[0,1],[2,3]]", NULL);
  dist_placement p[2] = {DIST_SHARD_DIM(0), DIST_SHARD_DIM(1)};
  dist_shape pieces[4] = {shape2(5, 3), shape2(5, 2), shape2(5, 3), shape2(5, 2)}, g, want;
  dist_global_of_pieces(&m, p, pieces, &g);
  cr_assert(dist_shape_equal(&g, &(dist_shape){2, {10, 5}}), "[%lld, %lld]",
            (long long)g.dims[0], (long long)g.dims[1]);
  cr_assert_eq(dist_first_misfit(&m, p, &g, pieces, &want), -1);
  /* Replicate on the second mesh dim: rank 1's copy is not added. */
  p[1] = DIST_REPLICATED;
  dist_shape rep[4] = {shape2(5, 5), shape2(5, 5), shape2(5, 5), shape2(5, 5)};
  dist_global_of_pieces(&m, p, rep, &g);
  cr_assert(dist_shape_equal(&g, &(dist_shape){2, {10, 5}}));
}

/* 10 rows over 4 ranks must be 3, 3, 3, 1: 3, 3, 2, 2 sums to 10 too, and
 * the first rank that differs is named with what it should hold. */
Test(pieces, pieces_off_the_split_rule_name_the_first_misfit) {
  dist_mesh_desc m = mesh_of("[0,1,2,3]", NULL);
  dist_placement s0 = DIST_SHARD_DIM(0);
  dist_shape good[4] = {shape2(3, 2), shape2(3, 2), shape2(3, 2), shape2(1, 2)};
  dist_shape bad[4] = {shape2(3, 2), shape2(3, 2), shape2(2, 2), shape2(2, 2)}, g, want;
  dist_global_of_pieces(&m, &s0, good, &g);
  cr_assert_eq(g.dims[0], 10);
  cr_assert_eq(dist_first_misfit(&m, &s0, &g, good, &want), -1);
  dist_global_of_pieces(&m, &s0, bad, &g);
  cr_assert_eq(g.dims[0], 10);
  cr_assert_eq(dist_first_misfit(&m, &s0, &g, bad, &want), 2);
  cr_assert(dist_shape_equal(&want, &(dist_shape){2, {3, 2}}));
}

/* ---- the union of meshes' ranks ------------------------------------------ */

Test(mesh, union_of_ranks_in_order_of_first_mention) {
  dist_mesh_desc a = mesh_of("[[3,1],[0,2]]", NULL), b = mesh_of("[2,5,1]", NULL);
  int ranks[8], n = dist_ranks_union_add(ranks, 0, 8, &a);
  n = dist_ranks_union_add(ranks, n, 8, &b);
  cr_assert_eq(n, 5);
  int want[5] = {3, 1, 0, 2, 5};
  cr_assert_arr_eq(ranks, want, sizeof want);
  cr_assert_eq(dist_ranks_union_add(ranks, 0, 2, &b), 2, "stops at max");
}
