/* Checkpoint files: see checkpoint.h. */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json_memory.h"
#include "safetensors.h"

int distd_ckpt_check_dir(const char *dir, dist_errbuf *eb) {
  if (!dir || dir[0] != '/')
    return dist_fail(eb, DIST_EINVAL, "checkpoint directory '%s' must be an "
                     "absolute path", dir ? dir : "");
  if (strstr(dir, "/../") || (strlen(dir) >= 3 && !strcmp(dir + strlen(dir) - 3, "/..")))
    return dist_fail(eb, DIST_EINVAL, "checkpoint directory '%s' must not "
                     "contain '..'", dir);
  if (strlen(dir) > 3000)
    return dist_fail(eb, DIST_EINVAL, "checkpoint directory path too long");
  return 0;
}

int distd_ckpt_check_id(const char *id, dist_errbuf *eb) {
  size_t n = strlen(id);
  int ok = n >= 1 && n <= 64;
  for (size_t i = 0; ok && i < n; i++)
    ok = (id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z') ||
         (id[i] >= '0' && id[i] <= '9') || id[i] == '_' || id[i] == '-';
  return ok ? 0 : dist_fail(eb, DIST_EINVAL, "bad checkpoint id '%.80s' (1 to "
                            "64 of [A-Za-z0-9_-])", id);
}

int distd_ckpt_check_file(const char *file, dist_errbuf *eb) {
  const char *suffix = ".safetensors";
  size_t n = strlen(file), sl = strlen(suffix);
  int ok = n > sl + 5 && strncmp(file, "rank", 4) == 0 &&
           strcmp(file + n - sl, suffix) == 0 && !strchr(file, '/') &&
           !strstr(file, "..");
  return ok ? 0 : dist_fail(eb, DIST_EINVAL, "bad checkpoint file name '%.80s'", file);
}

static void to_hex(const unsigned char *d, unsigned n, char *hex) {
  for (unsigned i = 0; i < n; i++) sprintf(hex + 2 * i, "%02x", d[i]);
  hex[2 * n] = 0;
}

static int write_all(int fd, const void *buf, size_t len, EVP_MD_CTX *md) {
  const char *p = buf;
  if (md && len) EVP_DigestUpdate(md, buf, len);
  while (len > 0) {
    ssize_t w = write(fd, p, len > (1u << 30) ? (1u << 30) : len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

static int fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  close(fd);
  return rc;
}

/* A file being written: its temp path, final path and digest. */
typedef struct atomic_file {
  char tmp[4096], final[4096];
  int fd;
  EVP_MD_CTX *md;
} atomic_file;

static int af_open(atomic_file *f, const char *dir, const char *name,
                   dist_errbuf *eb) {
  snprintf(f->final, sizeof f->final, "%s/%s", dir, name);
  snprintf(f->tmp, sizeof f->tmp, "%s/%s.tmp", dir, name);
  f->md = EVP_MD_CTX_new();
  EVP_DigestInit_ex(f->md, EVP_sha256(), NULL);
  f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f->fd < 0) {
    EVP_MD_CTX_free(f->md);
    return dist_fail(eb, DIST_EIO, "cannot create %s: %s", f->tmp, strerror(errno));
  }
  return 0;
}

/* Syncs and renames into place (commit) or removes the temp file. */
static int af_close(atomic_file *f, int commit, const char *dir, char *hex,
                    dist_errbuf *eb) {
  int rc = 0;
  if (commit && fsync(f->fd) != 0)
    rc = dist_fail(eb, DIST_EIO, "fsync %s: %s", f->tmp, strerror(errno));
  if (close(f->fd) != 0 && commit && rc == 0)
    rc = dist_fail(eb, DIST_EIO, "close %s: %s", f->tmp, strerror(errno));
  if (commit && rc == 0 && rename(f->tmp, f->final) != 0)
    rc = dist_fail(eb, DIST_EIO, "rename %s: %s", f->tmp, strerror(errno));
  if (commit && rc == 0 && fsync_dir(dir) != 0)
    rc = dist_fail(eb, DIST_EIO, "fsync %s: %s", dir, strerror(errno));
  if (!commit || rc != 0) unlink(f->tmp);
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned dl = 0;
  EVP_DigestFinal_ex(f->md, d, &dl);
  if (hex) to_hex(d, dl, hex);
  EVP_MD_CTX_free(f->md);
  return rc;
}

/* "rank<r>.<id>.safetensors": the name of rank r's file of checkpoint id. */
static void rank_file_name(char *file, size_t len, int rank, const char *id) {
  snprintf(file, len, "rank%d.%s.safetensors", rank, id);
}

int distd_ckpt_write_rank(const char *dir, const char *id, int rank,
                          const dist_st_tensor *entries, int n,
                          const char *const *extra_meta, int nextra, char *file,
                          size_t file_len, char *sha256_hex, uint64_t *bytes,
                          dist_errbuf *eb) {
  if (mkdir(dir, 0755) != 0 && errno != EEXIST)
    return dist_fail(eb, DIST_EIO, "cannot create %s: %s", dir, strerror(errno));
  if (nextra > 4) return dist_fail(eb, DIST_EINVAL, "too much checkpoint metadata");
  rank_file_name(file, file_len, rank, id);
  char rank_s[16];
  snprintf(rank_s, sizeof rank_s, "%d", rank);
  const char *meta[14] = {"format", "distd", "rank", rank_s, "checkpoint", id};
  memcpy(meta + 6, extra_meta, 2 * (size_t)nextra * sizeof *meta);
  void *head = NULL;
  size_t hl = 0;
  atomic_file f;
  int rc = dist_st_encode_header(entries, n, meta, 3 + nextra, &head, &hl, eb);
  if (rc == 0) rc = af_open(&f, dir, file, eb);
  if (rc == 0) {
    int ok = write_all(f.fd, head, hl, f.md) == 0;
    *bytes = hl;
    for (int i = 0; ok && i < n; i++) {
      size_t len = (size_t)dist_shape_numel(&entries[i].shape) *
                   dist_dtype_size(entries[i].dtype);
      ok = write_all(f.fd, entries[i].data, len, f.md) == 0;
      *bytes += len;
    }
    if (!ok) dist_fail(eb, DIST_EIO, "write %s: %s", f.tmp, strerror(errno));
    rc = af_close(&f, ok, dir, sha256_hex, ok ? eb : NULL);
    if (!ok) rc = DIST_EIO;
  }
  free(head);
  return rc;
}

int distd_ckpt_write_manifest(const char *dir, const char *text, dist_errbuf *eb) {
  atomic_file f;
  if (af_open(&f, dir, DISTD_CKPT_MANIFEST, eb) != 0) return DIST_EIO;
  int ok = write_all(f.fd, text, strlen(text), NULL) == 0;
  if (!ok) dist_fail(eb, DIST_EIO, "write %s: %s", f.tmp, strerror(errno));
  int rc = af_close(&f, ok, dir, NULL, ok ? eb : NULL);
  return ok ? rc : DIST_EIO;
}

static int read_whole(const char *path, void **out, size_t *len, dist_errbuf *eb) {
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return dist_fail(eb, errno == ENOENT ? DIST_ENOTFOUND : DIST_EIO,
                     "cannot open %s: %s", path, strerror(errno));
  struct stat sb;
  int rc = 0;
  char *buf = NULL;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    rc = dist_fail(eb, DIST_EIO, "%s is not a readable file", path);
    goto out;
  }
  size_t size = (size_t)sb.st_size, got = 0;
  if (!(buf = malloc(size + 1))) {
    rc = dist_fail(eb, DIST_ENOMEM, "cannot hold %s (%zu bytes)", path, size);
    goto out;
  }
  while (got < size) {
    ssize_t r = read(fd, buf + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      rc = dist_fail(eb, DIST_EIO, "read %s: %s", path, r ? strerror(errno) : "short file");
      goto out;
    }
    got += (size_t)r;
  }
  buf[size] = 0;
  *out = buf, buf = NULL;
  *len = size;
out:
  free(buf);
  close(fd);
  return rc;
}

int distd_ckpt_read_manifest(const char *dir, char **text, dist_errbuf *eb) {
  char path[4096];
  size_t len;
  snprintf(path, sizeof path, "%s/%s", dir, DISTD_CKPT_MANIFEST);
  int rc = read_whole(path, (void **)text, &len, eb);
  if (rc == DIST_ENOTFOUND)
    dist_fail(eb, rc, "no checkpoint in %s (%s is missing)", dir, DISTD_CKPT_MANIFEST);
  return rc;
}

int distd_ckpt_read_file(const char *dir, const char *file, const char *want_hex,
                         void **bytes, size_t *len, dist_errbuf *eb) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  int rc = read_whole(path, bytes, len, eb);
  if (rc != 0) return rc;
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned dl = 0;
  char hex[2 * EVP_MAX_MD_SIZE + 1];
  EVP_Digest(*bytes, *len, d, &dl, EVP_sha256(), NULL);
  to_hex(d, dl, hex);
  if (strcmp(hex, want_hex) != 0) {
    free(*bytes);
    *bytes = NULL;
    return dist_fail(eb, DIST_EIO, "%s is corrupt: sha256 %.16s..., the manifest "
                     "says %.16s...", path, hex, want_hex);
  }
  return 0;
}

int distd_ckpt_parse_file(const char *name, int *rank, char *id, size_t id_len) {
  const char *p = name + 4, *dot;
  char *end;
  if (strncmp(name, "rank", 4) != 0 || *p < '0' || *p > '9') return 0;
  long r = strtol(p, &end, 10);
  if (*end != '.' || r > 1000000 || !(dot = strchr(end + 1, '.'))) return 0;
  size_t n = (size_t)(dot - (end + 1));
  if (n == 0 || n >= id_len) return 0;
  if (strcmp(dot, ".safetensors") != 0 && strcmp(dot, ".safetensors.tmp") != 0) return 0;
  memcpy(id, end + 1, n);
  id[n] = 0;
  *rank = (int)r;
  return 1;
}

int distd_ckpt_manifest_files(const char *dir, char ***files, size_t *n) {
  *files = NULL;
  *n = 0;
  char *text = NULL;
  dist_errbuf eb = DIST_ERRBUF_INIT;
  if (distd_ckpt_read_manifest(dir, &text, &eb) != 0) return eb.code == DIST_ENOMEM ? -1 : 0;
  json_error_t err;
  int jansson_lost;
  json_t *doc = dist_json_loadb(text, strlen(text), 0, &err, &jansson_lost),
         *list = json_object_get(doc, "files");
  size_t count = json_array_size(list);
  /* jansson's own allocation failing must not read as a manifest naming
   * no file, by which a commit would remove them all. */
  int lost = jansson_lost || !(*files = calloc(count + 1, sizeof **files));
  for (size_t i = 0; !lost && i < count; i++) {
    const char *f = json_string_value(json_object_get(json_array_get(list, i), "file"));
    if (f && !((*files)[*n] = strdup(f))) lost = 1;
    else if (f) (*n)++;
  }
  json_decref(doc);
  free(text);
  if (!lost) return (int)*n;
  distd_ckpt_files_free(*files, *n);
  *files = NULL, *n = 0;
  return -1;
}

void distd_ckpt_files_free(char **files, size_t n) {
  for (size_t i = 0; i < n; i++) free(files[i]);
  free(files);
}

static int named(const char *name, char *const *keep, size_t nkeep) {
  for (size_t i = 0; i < nkeep; i++)
    if (!strcmp(keep[i], name)) return 1;
  return 0;
}

/* Whether the manifest in place names one of the committed save's files:
 * then that save is the checkpoint in place (its id is new, so no older
 * manifest names it, and no commit crossing it can come back: one that
 * reached rank 0 before it would have been replaced by it). */
static int committed_in_place(const distd_ckpt_stale_rule *rule) {
  for (size_t i = 0; i < rule->nkeep; i++)
    if (named(rule->keep[i], rule->in_place, rule->nin_place)) return 1;
  return 0;
}

int64_t distd_ckpt_mtime_ms(int dfd, const char *path) {
  struct stat sb;
  if (fstatat(dfd, path, &sb, AT_SYMLINK_NOFOLLOW) != 0) return -1;
  return (int64_t)sb.st_mtim.tv_sec * 1000 + sb.st_mtim.tv_nsec / 1000000;
}

/* Whether name, one of this daemon's rank files in directory dfd that its
 * record does not keep, may be of a save the record lost in a restart.
 * Not a temp file: the process that was writing it is gone, so it will
 * never be renamed into place. */
static int may_be_from_before_restart(int dfd, const char *name,
                                      const distd_ckpt_stale_rule *rule) {
  size_t n = strlen(name);
  int64_t mtime_ms = distd_ckpt_mtime_ms(dfd, name);
  if ((n > 4 && !strcmp(name + n - 4, ".tmp")) || mtime_ms < 0) return 0;
  return rule->from_before_restart(rule->arg, name, mtime_ms);
}

/* Whether this daemon removes name from directory dfd (see
 * distd_ckpt_remove_stale); in_place_is_ours is committed_in_place(rule). */
static int is_stale(int dfd, const char *name, const distd_ckpt_stale_rule *rule,
                    int in_place_is_ours) {
  if (!strcmp(name, DISTD_CKPT_MANIFEST ".tmp")) return rule->rank == 0;
  int r;
  char id[80];
  if (!distd_ckpt_parse_file(name, &r, id, sizeof id)) return 0;
  if (r != rule->rank && r < rule->world_size) return 0;
  int (*kept)(void *, const char *) = in_place_is_ours ? rule->in_progress : rule->keeps;
  if (named(name, rule->keep, rule->nkeep) || named(name, rule->in_place, rule->nin_place) ||
      kept(rule->arg, id))
    return 0;
  return r != rule->rank || !may_be_from_before_restart(dfd, name, rule);
}

int distd_ckpt_discard(const char *dir, const char *id, int rank) {
  char file[256], path[4096];
  rank_file_name(file, sizeof file, rank, id);
  int removed = 0;
  snprintf(path, sizeof path, "%s/%s", dir, file);
  removed += unlink(path) == 0;
  snprintf(path, sizeof path, "%s/%s.tmp", dir, file);
  removed += unlink(path) == 0;
  if (removed) fsync_dir(dir);
  return removed;
}

int distd_ckpt_remove_stale(const char *dir, const distd_ckpt_stale_rule *rule) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int removed = 0, in_place_is_ours = committed_in_place(rule);
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!is_stale(dirfd(d), e->d_name, rule, in_place_is_ours)) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    removed += unlink(path) == 0;
  }
  closedir(d);
  fsync_dir(dir);
  return removed;
}
