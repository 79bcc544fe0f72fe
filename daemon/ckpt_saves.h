/* The checkpoint saves in progress on one daemon, so that a commit into a
 * directory never removes the files of another save still running there,
 * nor those of a save committed meanwhile that may be the one in place.
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
 * names the id makes it committed (below), and a Discard of it or the Save
 * failing settles it. A save
 * its client abandoned (killed between Save and Commit, or unable to
 * reach this daemon for the Discard) is never settled: its mark lapses
 * keep_ms after the Save was answered, and the next commit removes its
 * files as stale, as every file of a save that is over and that the
 * manifest does not name (superseded) is.
 *
 * Two commits can also cross: x's reaches rank 0, then y's every daemon,
 * then x's the others. Rank 0's manifest names y's files then, and x's
 * keep list does not; where directories are not shared, no daemon but
 * rank 0 can read that manifest to keep them. So a daemon also remembers
 * the saves it saw committed while a crossing commit may still reach it:
 * while a save whose Save began here before that commit is in progress
 * here. x is such a save: its Save here was answered before its commit
 * reached rank 0, before y's did, and y's reaches this daemon after
 * (libdist commits on rank 0 first, and on the others once it succeeded).
 * Once no such save is left, every later commit here is of a save that
 * began here after y's commit, so it reached rank 0 after y's did: y is
 * no longer the checkpoint in place, and its files go as stale. A
 * committed save thus costs nothing when saves do not overlap: the next
 * commit removes its files as before.
 *
 * The record lives in memory: a daemon restarted (or killed and started
 * again) between a save's Save and its Commit has lost it. So a commit
 * also keeps this rank's files written before the record began while
 * their save may still be in progress or crossed: 2 x keep_ms after the
 * file was written (a save commits within keep_ms of its Save's answer,
 * which comes after its file is written; a commit crossing a committed
 * save comes within keep_ms of the crossing save's Save answer, which came
 * before the crossed save's commit, itself within keep_ms of its file).
 * Such a file then goes with the first commit past that time, unless a
 * Save here saw it named by the manifest in place: a committed save's, in
 * progress nowhere and kept by any commit while that manifest is in place,
 * so the next commit removes it, as before the restart. Where the manifest
 * is not visible (ranks but 0 with directories of their own), the record
 * cannot tell, and the file waits out its time. The files written since
 * the record began are judged by the record alone, as before. File times
 * are on the wall clock, which must be in step with the daemon's (as it is
 * on a local file system; on a shared one, the server's).
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
 * rather than forgetting one (which would let a commit remove its files).
 * At most this many committed saves are remembered too; past it the one
 * committed longest ago is forgotten (a crossing commit would have to come
 * after this many later ones). */
#define DISTD_CKPT_SAVES_MAX 1024

/* A record whose marks of saves in progress lapse keep_ms after they were
 * made; NULL when out of memory. */
distd_ckpt_saves *distd_ckpt_saves_new(int64_t keep_ms);
void distd_ckpt_saves_free(distd_ckpt_saves *s); /* NULL is a no-op */

/* Marks id's save in progress as of now (again, when marked). Fails with
 * DIST_EUNAVAIL when DISTD_CKPT_SAVES_MAX others are in progress. */
int distd_ckpt_saves_mark(distd_ckpt_saves *s, const char *id, int rank, dist_errbuf *eb);
/* id's save failed or was discarded here: forgotten; a no-op for an id
 * not marked. */
void distd_ckpt_saves_settle(distd_ckpt_saves *s, const char *id);
/* id's save was committed here (marked or not): remembered while a
 * crossing commit may still come. */
void distd_ckpt_saves_committed(distd_ckpt_saves *s, const char *id);
/* 1 when id's save is in progress (marked, not settled nor committed, not
 * lapsed). */
int distd_ckpt_saves_in_progress(void *s, const char *id);
/* 1 when id's save is in progress, or was committed while a crossing
 * commit may still come. The signatures are those of
 * distd_ckpt_remove_stale's in_progress and keeps (checkpoint.h). */
int distd_ckpt_saves_keeps(void *s, const char *id);
/* 1 while files from before this record began may still be kept:
 * less than 2 x keep_ms after it began. */
int distd_ckpt_saves_began_lately(distd_ckpt_saves *s);
/* file, of this rank and modified at mtime_ms (wall clock), is named by a
 * manifest in place, so it is of a committed save and of none in
 * progress; noted when written before this record began. */
void distd_ckpt_saves_saw_in_manifest(distd_ckpt_saves *s, const char *file, int64_t mtime_ms);
/* 1 when file, of this rank and modified at mtime_ms, was written before
 * this record began (by this rank's daemon before a restart), less than
 * 2 x keep_ms ago, and not noted committed: it may be of a save in
 * progress or crossed. The signature is that of distd_ckpt_remove_stale's
 * from_before_restart. */
int distd_ckpt_saves_may_be_from_before_restart(void *s, const char *file, int64_t mtime_ms);

/* Brackets a commit, so that commits on this daemon run one at a time. */
void distd_ckpt_saves_commit_begin(distd_ckpt_saves *s);
void distd_ckpt_saves_commit_end(distd_ckpt_saves *s);

#endif
