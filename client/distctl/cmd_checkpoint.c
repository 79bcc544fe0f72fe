/* distctl checkpoint save|restore DIR: the whole store (or --tensors) to one
 * safetensors file per daemon plus DIR/manifest.json, and back, optionally
 * onto another mesh or other placements. Progress goes to stderr; --json
 * prints the result on stdout.
 *
 * DIR is made absolute here: the daemons resolve it, and they must all see
 * it at that path (a shared filesystem when they run on several hosts). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "distctl.h"

/* A checkpoint verb's options, by where they sit in its table; save
 * takes --tensors alone, at the same place. */
enum { OPT_TENSORS, OPT_MESH, OPT_DIM_NAMES, OPT_PLACEMENTS, NOPTIONS };
static const distctl_option restore_options[NOPTIONS + 1] = {
    [OPT_TENSORS] = {"--tensors", "a,b,...", "only these tensors (default: every one in the "
                     "checkpoint)", NULL, DISTCTL_OPTIONAL},
    [OPT_MESH] = {"--mesh", "MESH", "the mesh to load onto, as a nested "
                  "list; fewer daemons than saved may hold it", NULL, DISTCTL_OPTIONAL},
    [OPT_DIM_NAMES] = DISTCTL_DIM_NAMES_OPTION,
    [OPT_PLACEMENTS] = {"--placements", "P", "the placements to load onto, one per mesh dim "
                        "(default: as saved)", NULL, DISTCTL_OPTIONAL},
};
static const distctl_relation restore_relations[] = {
    {"--mesh", DISTCTL_NEEDS, "--placements"},
    DISTCTL_DIM_NAMES_NEEDS_MESH,
    {NULL, 0, NULL},
};
static const distctl_option save_options[2] = {
    {"--tensors", "a,b,...", "only these tensors (default: every one in the store)", NULL,
     DISTCTL_OPTIONAL},
};

/* "a,b,c" -> an array of names pointing into *copy (both malloc'd). */
static char **split_names(const char *text, int *n, char **copy) {
  *copy = strdup(text);
  size_t cap = 2;
  for (const char *p = text; *p; p++) cap += *p == ',';
  char **names = calloc(cap, sizeof *names);
  *n = 0;
  for (char *save = NULL, *tok = strtok_r(*copy, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save))
    names[(*n)++] = tok;
  return names;
}

static char *absolute_dir(const char *dir) {
  if (dir[0] == '/') return strdup(dir);
  char cwd[4096];
  if (!getcwd(cwd, sizeof cwd)) return NULL;
  size_t len = strlen(cwd) + strlen(dir) + 2;
  char *out = malloc(len);
  snprintf(out, len, "%s/%s", cwd, dir);
  return out;
}

static void show_progress(void *arg, const char *phase, int rank, int done,
                          int total, uint64_t bytes) {
  (void)arg;
  char b[32];
  dist_format_bytes(bytes, b, sizeof b);
  if (rank >= 0)
    fprintf(stderr, "checkpoint: %-7s rank %d (%d/%d) %s\n", phase, rank, done,
            total, b);
  else
    fprintf(stderr, "checkpoint: %-7s tensor %d/%d\n", phase, done, total);
}

static void print_result(const distctl_global *g, const char *what,
                         const char *dir, const dist_checkpoint_info *info) {
  char b[32];
  dist_format_bytes(info->bytes, b, sizeof b);
  if (info->params_reset)
    fprintf(stderr, "distctl: %d parameter%s restored without their optimizer "
            "state (onto Partial placements, which it cannot follow): "
            "configure them again before pushing\n",
            info->params_reset, info->params_reset == 1 ? "" : "s");
  if (g->json) {
    distctl_print_json(json_pack("{s:s, s:s, s:s, s:i, s:i, s:I, s:i, s:i}",
                                 "operation", what, "dir", dir, "checkpoint_id",
                                 info->id, "tensors", info->ntensors, "files",
                                 info->nfiles, "bytes", (json_int_t)info->bytes,
                                 "parameters", info->nparams, "parameters_reset",
                                 info->params_reset));
    return;
  }
  char params[64] = "";
  if (info->nparams)
    snprintf(params, sizeof params, " (%d parameter%s with optimizer state)",
             info->nparams, info->nparams == 1 ? "" : "s");
  printf("%s %s: %d tensor%s%s, %d file%s, %s%s%s\n", what, dir, info->ntensors,
         info->ntensors == 1 ? "" : "s", params, info->nfiles,
         info->nfiles == 1 ? "" : "s", b, info->id[0] ? ", id " : "", info->id);
}

/* Whether a restore limited to names (n of them; none: all) takes name. */
static int restores(const char *name, char **names, int n) {
  for (int i = 0; i < n; i++)
    if (strcmp(names[i], name) == 0) return 1;
  return n == 0;
}

/* The placements must fit one saved tensor: one per dim of its saved mesh
 * (unless --mesh replaces it, checked at parsing) and Shard(d) of its
 * dims. Returns 0 or 2. */
static int check_saved_tensor(const distctl_command *cmd, json_t *t, const dist_placement *p,
                              int np, int new_mesh) {
  const char *name = json_string_value(json_object_get(t, "name"));
  json_t *mesh_shape = json_object_get(json_object_get(t, "mesh"), "shape");
  if (!name || !json_is_array(mesh_shape)) return 0; /* libdist names a bad manifest */
  char whose[300], what[300];
  snprintf(whose, sizeof whose, "the saved mesh of '%.255s'", name);
  snprintf(what, sizeof what, "'%.255s'", name);
  if (!new_mesh && distctl_check_count(cmd, np, (int)json_array_size(mesh_shape), whose))
    return 2;
  return distctl_check_shard_dims(cmd, p, np, (int)json_array_size(json_object_get(t, "shape")),
                                  what);
}

/* Placements that cannot fit a tensor the restore takes are a usage
 * error, as for tensor put: the count is checked against each tensor's
 * saved mesh, which only DIR/manifest.json knows. Where this host cannot
 * read it (the daemons may see DIR on a filesystem we do not), libdist
 * still refuses placements that do not fit, naming the tensor. */
static int check_saved_layouts(const distctl_command *cmd, const char *dir, char **names,
                               int n, const dist_placement *p, int np, int new_mesh) {
  char path[4200];
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  json_t *doc = json_load_file(path, 0, NULL), *t;
  size_t i;
  int rc = 0;
  json_array_foreach(json_object_get(doc, "tensors"), i, t) {
    const char *name = json_string_value(json_object_get(t, "name"));
    if (rc == 0 && name && restores(name, names, n))
      rc = check_saved_tensor(cmd, t, p, np, new_mesh);
  }
  json_decref(doc);
  return rc;
}

/* A restore's --mesh and --placements (*np of them), checked against the
 * tensors it takes (names, n of them; none: all). Returns 0 or 2. */
static int restore_layout(const distctl_command *cmd, const distctl_args *a, const char *dir,
                          char **names, int n, dist_mesh **mesh, dist_placement *p,
                          int *np) {
  distctl_layout_text text = {a->value[OPT_MESH], a->value[OPT_DIM_NAMES],
                              a->value[OPT_PLACEMENTS]};
  if (distctl_parse_layout(cmd, &text, mesh, p, np) != 0) return 2;
  return check_saved_layouts(cmd, dir, names, n, p, *np, *mesh != NULL);
}

static int run(const distctl_command *cmd, const distctl_global *g, int argc,
               char **argv, int restore) {
  distctl_args a;
  if (distctl_take_options(cmd, argc, argv, &a) != 0) return 2;
  const char *tensors = a.value[OPT_TENSORS], *placements = a.value[OPT_PLACEMENTS];
  dist_checkpoint_opts o = DIST_CHECKPOINT_OPTS_INIT;
  dist_placement p[DIST_MAX_MESH_DIMS];
  dist_mesh *mesh = NULL;
  dist_client *c = NULL;
  dist_checkpoint_info info;
  char **names = NULL, *names_text = NULL, *dir = NULL;
  int n = 0, rc = 2;
  if (tensors) {
    names = split_names(tensors, &n, &names_text);
    if (n == 0) {
      rc = distctl_usage(cmd, "--tensors names no tensor");
      goto out;
    }
    o.tensors = (const char *const *)names;
    o.ntensors = n;
  }
  if (!(dir = absolute_dir(a.word[0]))) {
    rc = distctl_fail("cannot resolve '%s': %s", a.word[0], strerror(errno));
    goto out;
  }
  if (restore && placements &&
      restore_layout(cmd, &a, dir, names, n, &mesh, p, &o.nplacements) != 0)
    goto out;
  o.mesh = mesh;
  o.placements = placements ? p : NULL;
  o.progress = show_progress;
  rc = 1;
  if (!(c = distctl_connect(g))) goto out;
  int err = restore ? dist_checkpoint_restore(c, dir, &o, &info)
                    : dist_checkpoint_save(c, dir, &o, &info);
  if (err != 0) {
    rc = distctl_fail("checkpoint %s %s: %s", restore ? "restore" : "save", dir,
                      dist_errmsg(c));
    goto out;
  }
  print_result(g, restore ? "restored" : "saved", dir, &info);
  rc = 0;
out:
  dist_close(c);
  dist_mesh_free(mesh);
  free(names);
  free(names_text);
  free(dir);
  return rc;
}

static int run_save(const distctl_global *g, int argc, char **argv);
static int run_restore(const distctl_global *g, int argc, char **argv);

const distctl_command distctl_cmd_checkpoint_save = {
    .name = "checkpoint save",
    .words = {{"DIR", DISTCTL_REQUIRED}},
    .help = "write every tensor (or the named ones) to DIR: one safetensors file per "
    "daemon and a manifest, atomically",
    .run = run_save,
    .options = save_options};
const distctl_command distctl_cmd_checkpoint_restore = {
    .name = "checkpoint restore",
    .words = {{"DIR", DISTCTL_REQUIRED}},
    .help = "load a checkpoint back (verified first), optionally onto another mesh or "
    "placements; onto fewer daemons than saved with --mesh",
    .run = run_restore,
    .options = restore_options,
    .relations = restore_relations};

static int run_save(const distctl_global *g, int argc, char **argv) {
  return run(&distctl_cmd_checkpoint_save, g, argc, argv, 0);
}

static int run_restore(const distctl_global *g, int argc, char **argv) {
  return run(&distctl_cmd_checkpoint_restore, g, argc, argv, 1);
}
