/* Checkpoint files on the daemon side: each daemon writes its own pieces to
 * DIR/rank<r>.<id>.safetensors and reads them back; one daemon writes
 * DIR/manifest.json for the client. Every file is written atomically (temp
 * file, fsync, rename, fsync of the directory), and files of a new
 * checkpoint get new names, so until the manifest is switched the previous
 * checkpoint stays whole. */
#ifndef DISTD_CHECKPOINT_H
#define DISTD_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "errbuf.h"
#include "safetensors.h"
#include "store.h"

#define DISTD_CKPT_MANIFEST "manifest.json"

/* dir must be an absolute path without "..", id [A-Za-z0-9_-]{1,64}. */
int distd_ckpt_check_dir(const char *dir, dist_errbuf *eb);
int distd_ckpt_check_id(const char *id, dist_errbuf *eb);
/* A file name a checkpoint may name: "rank<r>.<id>.safetensors". */
int distd_ckpt_check_file(const char *file, dist_errbuf *eb);

/* Writes entries[0..n) to DIR/rank<rank>.<id>.safetensors, creating DIR
 * when missing, with nextra (at most 4) more metadata key/value pairs
 * (keys at even indices). file gets the name; sha256_hex the lowercase hex
 * digest of the whole file (65 bytes with the NUL). */
int distd_ckpt_write_rank(const char *dir, const char *id, int rank,
                          const dist_st_tensor *entries, int n,
                          const char *const *extra_meta, int nextra, char *file,
                          size_t file_len, char *sha256_hex, uint64_t *bytes,
                          dist_errbuf *eb);
/* Writes DIR/manifest.json atomically. */
int distd_ckpt_write_manifest(const char *dir, const char *text, dist_errbuf *eb);
/* Reads DIR/manifest.json into a malloc'd NUL-terminated string. */
int distd_ckpt_read_manifest(const char *dir, char **text, dist_errbuf *eb);
/* Reads DIR/file whole (malloc'd) and checks its sha256 against want_hex. */
int distd_ckpt_read_file(const char *dir, const char *file, const char *want_hex,
                         void **bytes, size_t *len, dist_errbuf *eb);
/* Removes DIR/rank<rank>.<id>.safetensors and its temp file, the file of
 * a save that failed, and nothing else; returns how many were removed. */
int distd_ckpt_discard(const char *dir, const char *id, int rank);
/* 1 when name is a rank file, "rank<r>.<id>.safetensors", or its temp
 * file: then *rank and id (of id_len bytes, NUL-terminated) are set. */
int distd_ckpt_parse_file(const char *name, int *rank, char *id, size_t id_len);

/* The files DIR/manifest.json names, in a malloc'd array of malloc'd
 * names (free with distd_ckpt_files_free); none when the manifest is
 * missing, unreadable or not JSON. Returns how many, or -1 when memory
 * ran out reading it (then the list, freed, is not the manifest's: a
 * caller must not remove files by it). */
int distd_ckpt_manifest_files(const char *dir, char ***files, size_t *n);
void distd_ckpt_files_free(char **files, size_t n); /* NULL is a no-op */

/* Which files of a checkpoint directory a commit on this daemon removes. */
typedef struct distd_ckpt_stale_rule {
  int rank, world_size;    /* this daemon's */
  char *const *keep;       /* the files of the save committed */
  size_t nkeep;
  char *const *in_place;   /* the files the manifest in place names */
  size_t nin_place;
  /* 1 when checkpoint id's save is in progress here, and 1 also when
   * committed here while a crossing commit may come (ckpt_saves.h) */
  int (*in_progress)(void *arg, const char *id);
  int (*keeps)(void *arg, const char *id);
  /* 1 when a rank file of this daemon's modified at mtime_ms (wall clock)
   * may be of a save that its record, lost in a restart, would keep */
  int (*from_before_restart)(void *arg, const char *file, int64_t mtime_ms);
  void *arg;
} distd_ckpt_stale_rule;

/* Removes the files of DIR this daemon is the one to judge stale: its own
 * rank files (and their temp files) that neither rule->keep nor the
 * manifest in place names, of a checkpoint id rule->keeps does not keep
 * (rule->in_progress, when the manifest in place is the committed save's);
 * the rank files of ranks past the world, which no daemon
 * here writes; and, on rank 0 (the manifest's writer), a leftover
 * manifest temp file. The other ranks'
 * files are theirs to judge: where daemons share the directory, this one
 * cannot know that another's save is in progress (it may not have been
 * asked to save yet). The manifest in place is another save's when two
 * commits cross: x's reaches rank 0, then y's every daemon, then x's rank
 * 1, whose keep list is x's while the manifest is y's; where rank 1 cannot
 * read that manifest, rule->keeps keeps y's file. Where the manifest in
 * place is the committed save's, no save committed before it is in place,
 * nor can be again, and rule->in_progress suffices (always so on rank 0,
 * which just wrote it). Its own rank files from before a restart stay
 * while rule->from_before_restart says so (their temp files go: their
 * writer is gone). Returns how many files were removed. */
int distd_ckpt_remove_stale(const char *dir, const distd_ckpt_stale_rule *rule);

/* The modification time of path (relative to directory dfd, or AT_FDCWD)
 * on the wall clock, in ms; -1 when it cannot be read. */
int64_t distd_ckpt_mtime_ms(int dfd, const char *path);

#endif
