/* The checkpoint saves in progress on one daemon, so that a commit into a
 * directory never removes the files of another save still running there.
 *
 * A save writes each daemon's file (Save), then switches the manifest and
 * has every daemon remove the rank files the new manifest does not name
 * (Commit). Two saves into one directory overlap: B may commit while A's
 * files are written and A's commit is still to come. B's keep list names
 * B's files only, so without this record B's commit removed A's, and A's
 * commit then wrote a manifest naming files that were gone.
 *
 * A daemon marks a checkpoint id in progress when its Save starts (before
 * the temp file exists, so a commit's directory scan that sees the file
 * also sees the mark) and again when it answers; a Commit whose keep list
 * names the id, a Discard of it, or the Save failing settles it. A save
 * its client abandoned (killed between Save and Commit, or unable to
 * reach this daemon for the Discard) is never settled: its mark lapses
 * keep_ms after the Save was answered, and the next commit removes its
 * files as stale, as every file of a settled save that the manifest does
 * not name (superseded) is.
 *
 * Commits on one daemon run one at a time: the manifest's temp file has
 * one name, and two commits writing it at once could rename a mixture of
 * both manifests into place. */
#ifndef DISTD_CKPT_SAVES_H
#define DISTD_CKPT_SAVES_H

#include <stdint.h>

#include "errbuf.h"

typedef struct distd_ckpt_saves distd_ckpt_saves;

/* At most this many saves in progress at once; a Save past it is refused
 * rather than forgetting one (which would let a commit remove its files). */
#define DISTD_CKPT_SAVES_MAX 1024

/* A record whose marks lapse keep_ms after they were made; NULL when out
 * of memory. */
distd_ckpt_saves *distd_ckpt_saves_new(int64_t keep_ms);
void distd_ckpt_saves_free(distd_ckpt_saves *s); /* NULL is a no-op */

/* Marks id's save in progress as of now (again, when marked). Fails with
 * DIST_EUNAVAIL when DISTD_CKPT_SAVES_MAX others are in progress. */
int distd_ckpt_saves_mark(distd_ckpt_saves *s, const char *id, int rank, dist_errbuf *eb);
/* id's save is over here (committed, discarded or failed); a no-op for an
 * id not marked. */
void distd_ckpt_saves_settle(distd_ckpt_saves *s, const char *id);
/* 1 when id's save is in progress (marked, not settled, not lapsed). The
 * signature is distd_ckpt_remove_stale's in_progress (checkpoint.h). */
int distd_ckpt_saves_in_progress(void *s, const char *id);

/* Brackets a commit, so that commits on this daemon run one at a time. */
void distd_ckpt_saves_commit_begin(distd_ckpt_saves *s);
void distd_ckpt_saves_commit_end(distd_ckpt_saves *s);

#endif
