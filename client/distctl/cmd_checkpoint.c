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
#include "mesh.h"

typedef struct ckpt_args {
  const char *dir, *tensors, *mesh, *dim_names, *placements;
} ckpt_args;

static int parse_args(const distctl_command *cmd, int argc, char **argv,
                      int restore, ckpt_args *a) {
  memset(a, 0, sizeof *a);
  for (int i = 0; i < argc; i++) {
    const char *v;
    if ((v = distctl_opt(argc, argv, &i, "--tensors"))) a->tensors = v;
    else if (restore && (v = distctl_opt(argc, argv, &i, "--mesh"))) a->mesh = v;
    else if (restore && (v = distctl_opt(argc, argv, &i, "--dim-names"))) a->dim_names = v;
    else if (restore && (v = distctl_opt(argc, argv, &i, "--placements"))) a->placements = v;
    else if (argv[i][0] == '-' && argv[i][1])
      return distctl_usage(cmd, "unknown option '%s'", argv[i]);
    else if (a->dir) return distctl_usage(cmd, "unexpected argument '%s'", argv[i]);
    else a->dir = argv[i];
  }
  if (!a->dir || !a->dir[0]) return distctl_usage(cmd, "missing DIR");
  if ((a->mesh || a->dim_names) && !a->placements)
    return distctl_usage(cmd, "--mesh needs --placements");
  if (a->dim_names && !a->mesh) return distctl_usage(cmd, "--dim-names needs --mesh");
  return 0;
}

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

/* Builds the target layout of a restore. Returns 0 or 2 (usage). */
static int parse_layout(const distctl_command *cmd, const ckpt_args *a,
                        dist_mesh **mesh, dist_placement *p) {
  dist_errbuf eb = DIST_ERRBUF_INIT;
  int np = 0;
  if (a->mesh) {
    dist_mesh_desc d;
    if (dist_mesh_parse(&d, a->mesh, a->dim_names, &eb) != 0)
      return distctl_usage(cmd, "bad --mesh '%s': %s", a->mesh, dist_errbuf_msg(&eb));
    const char *names[DIST_MAX_MESH_DIMS];
    for (int i = 0; i < d.ndim; i++) names[i] = d.dim_names[i];
    if (dist_mesh_new(d.ndim, d.shape, d.ranks, names, mesh) != 0)
      return distctl_usage(cmd, "bad --mesh '%s'", a->mesh);
  }
  if (dist_placements_parse(a->placements, p, DIST_MAX_MESH_DIMS, &np, &eb) != 0)
    return distctl_usage(cmd, "bad --placements '%s': %s", a->placements,
                         dist_errbuf_msg(&eb));
  if (*mesh && np != dist_mesh_ndim(*mesh))
    return distctl_usage(cmd, "--placements gives %d placements, the mesh has %d "
                         "dims", np, dist_mesh_ndim(*mesh));
  return 0;
}

static int run(const distctl_command *cmd, const distctl_global *g, int argc,
               char **argv, int restore) {
  ckpt_args a;
  if (parse_args(cmd, argc, argv, restore, &a) != 0) return 2;
  dist_checkpoint_opts o = DIST_CHECKPOINT_OPTS_INIT;
  dist_placement p[DIST_MAX_MESH_DIMS];
  dist_mesh *mesh = NULL;
  dist_client *c = NULL;
  dist_checkpoint_info info;
  char **names = NULL, *names_text = NULL, *dir = NULL;
  int n = 0, rc = 2;
  if (restore && a.placements && parse_layout(cmd, &a, &mesh, p) != 0) goto out;
  if (a.tensors) {
    names = split_names(a.tensors, &n, &names_text);
    if (n == 0) {
      rc = distctl_usage(cmd, "--tensors names no tensor");
      goto out;
    }
    o.tensors = (const char *const *)names;
    o.ntensors = n;
  }
  o.mesh = mesh;
  o.placements = a.placements ? p : NULL;
  o.progress = show_progress;
  rc = 1;
  if (!(dir = absolute_dir(a.dir))) {
    rc = distctl_fail("cannot resolve '%s': %s", a.dir, strerror(errno));
    goto out;
  }
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
    "checkpoint save", "DIR [--tensors a,b,...]",
    "write every tensor (or the named ones) to DIR: one safetensors file per "
    "daemon and a manifest, atomically", run_save};
const distctl_command distctl_cmd_checkpoint_restore = {
    "checkpoint restore",
    "DIR [--tensors a,b,...] [--mesh M [--dim-names N] --placements P]",
    "load a checkpoint back (verified first), optionally onto another mesh or "
    "placements; onto fewer daemons than saved with --mesh", run_restore};

static int run_save(const distctl_global *g, int argc, char **argv) {
  return run(&distctl_cmd_checkpoint_save, g, argc, argv, 0);
}

static int run_restore(const distctl_global *g, int argc, char **argv) {
  return run(&distctl_cmd_checkpoint_restore, g, argc, argv, 1);
}
