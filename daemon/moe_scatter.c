/* global_scatter / global_gather over the peer data plane: one header and
 * one frame per (destination, expert) chunk to each member of the group;
 * see moe_scatter.h for the protocol. */
#include "moe_scatter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_signature.h"
#include "ops.h"

#define TAG_HEADER 0u
#define TAG_DATA 1u /* + the expert index within the receiving rank */
#define HEADER_MAGIC 0x31454f4du /* "MOE1" */
#define COUNT_MAX (INT64_C(1) << 40) /* rows per chunk: keeps sums exact */

/* What each member announces; followed by its local_count and global_count
 * (W*E int64 each). Peers run the same build, so host byte order is fine. */
typedef struct header_fixed {
  uint32_t magic, dir, size, experts;
  uint64_t row_bytes;
} header_fixed;

/* Row offsets and counts of every (rank, expert) chunk on both sides. */
typedef struct plan {
  const int64_t *send_count, *recv_count;
  int64_t *send_off, *recv_off;
} plan;

static const char *op_name(distd_moe_dir dir) {
  return dir == DISTD_MOE_SCATTER ? "global_scatter" : "global_gather";
}

static int check_array(const char *name, const int64_t *v, size_t n,
                       uint64_t *sum, dist_errbuf *eb) {
  *sum = 0;
  for (size_t i = 0; i < n; i++) {
    if (v[i] < 0 || v[i] > COUNT_MAX)
      return dist_fail(eb, DIST_EINVAL, "%s[%zu] = %lld is %s", name, i,
                       (long long)v[i], v[i] < 0 ? "negative" : "too large");
    *sum += (uint64_t)v[i];
  }
  return 0;
}

int distd_moe_check_counts(distd_moe_dir dir, int size, const int64_t *local,
                           size_t n_local, const int64_t *global,
                           size_t n_global, uint64_t in_rows, int *experts,
                           uint64_t *out_rows, dist_errbuf *eb) {
  if (size < 1) return dist_fail(eb, DIST_EINVAL, "empty group");
  if (n_local != n_global)
    return dist_fail(eb, DIST_EINVAL, "local_count has %zu entries but "
                     "global_count has %zu", n_local, n_global);
  if (n_local == 0 || n_local % (size_t)size)
    return dist_fail(eb, DIST_EINVAL, "counts have %zu entries: need W*E with "
                     "W = %d ranks in the group and E >= 1 experts per rank",
                     n_local, size);
  uint64_t sum_local, sum_global;
  if (check_array("local_count", local, n_local, &sum_local, eb) ||
      check_array("global_count", global, n_global, &sum_global, eb))
    return eb->code;
  int scatter = dir == DISTD_MOE_SCATTER;
  uint64_t need = scatter ? sum_local : sum_global;
  if (in_rows != need)
    return dist_fail(eb, DIST_EINVAL, "%s: x has %llu rows but sum(%s) = %llu",
                     op_name(dir), (unsigned long long)in_rows,
                     scatter ? "local_count" : "global_count",
                     (unsigned long long)need);
  *experts = (int)(n_local / (size_t)size);
  *out_rows = scatter ? sum_global : sum_local;
  return 0;
}

/* Chunk i = r*E+e in input order (what a scatter reads, a gather writes). */
static void rank_major(const int64_t *count, int n, int64_t *off) {
  int64_t acc = 0;
  for (int i = 0; i < n; i++) off[i] = acc, acc += count[i];
}

/* For each expert e, for each rank r: the expert-major layout. */
static void expert_major(const int64_t *count, int W, int E, int64_t *off) {
  int64_t acc = 0;
  for (int e = 0; e < E; e++)
    for (int r = 0; r < W; r++) off[r * E + e] = acc, acc += count[r * E + e];
}

static void make_plan(const distd_moe_args *a, int64_t *offs, plan *p) {
  int W = a->size, E = a->experts, n = W * E;
  p->send_off = offs;
  p->recv_off = offs + n;
  if (a->dir == DISTD_MOE_SCATTER) {
    p->send_count = a->local_count, p->recv_count = a->global_count;
    rank_major(a->local_count, n, p->send_off);
    expert_major(a->global_count, W, E, p->recv_off);
  } else {
    p->send_count = a->global_count, p->recv_count = a->local_count;
    expert_major(a->global_count, W, E, p->send_off);
    rank_major(a->local_count, n, p->recv_off);
  }
}

static size_t header_len(int W, int E) {
  return sizeof(header_fixed) + 2 * (size_t)W * (size_t)E * sizeof(int64_t);
}

static void build_header(const distd_moe_args *a, uint8_t *buf) {
  size_t n = (size_t)a->size * (size_t)a->experts;
  header_fixed h = {HEADER_MAGIC, (uint32_t)a->dir, (uint32_t)a->size,
                    (uint32_t)a->experts, a->row_bytes};
  memcpy(buf, &h, sizeof h);
  memcpy(buf + sizeof h, a->local_count, n * sizeof(int64_t));
  memcpy(buf + sizeof h + n * sizeof(int64_t), a->global_count, n * sizeof(int64_t));
}

/* The peer's fixed part must describe the same exchange as ours. */
static int check_fixed(const distd_moe_args *a, int j, const void *buf,
                       size_t len, dist_errbuf *eb) {
  int peer = a->group[j], me = a->group[a->me];
  header_fixed h;
  if (len < sizeof h || (memcpy(&h, buf, sizeof h), h.magic != HEADER_MAGIC))
    return dist_fail(eb, DIST_EPROTO, "op %llu: rank %d sent rank %d something "
                     "that is not a MoE exchange header", (unsigned long long)a->op_id,
                     peer, me);
  if (h.dir != (uint32_t)a->dir)
    return dist_fail(eb, DIST_EINVAL, "op %llu: rank %d runs %s but rank %d runs %s",
                     (unsigned long long)a->op_id, peer, op_name((distd_moe_dir)h.dir),
                     me, op_name(a->dir));
  if (h.size != (uint32_t)a->size || h.experts != (uint32_t)a->experts)
    return dist_fail(eb, DIST_EINVAL, "%s: rank %d has a group of %u ranks with %u "
                     "experts each, rank %d a group of %d with %d experts each",
                     op_name(a->dir), peer, h.size, h.experts, me, a->size, a->experts);
  if (h.row_bytes != a->row_bytes)
    return dist_fail(eb, DIST_EINVAL, "%s: rank %d has rows of %llu bytes, rank %d of "
                     "%zu (d_model or dtype differ)", op_name(a->dir), peer,
                     (unsigned long long)h.row_bytes, me, a->row_bytes);
  if (len != header_len(a->size, a->experts))
    return dist_fail(eb, DIST_EPROTO, "%s: rank %d sent a %zu-byte header, rank %d "
                     "expects %zu", op_name(a->dir), peer, len, me,
                     header_len(a->size, a->experts));
  return 0;
}

/* The first disagreement of the group's count matrix, in an order every
 * member shares, so each reports the same pair. lc[s] / gc[s]: member s's
 * counts. In a scatter rank s sends lc[s][r*E+e] rows to expert e of rank
 * r, which expects gc[r][s*E+e]; a gather moves the same rows back. */
static int check_matrix(const distd_moe_args *a, const int64_t *const *lc,
                        const int64_t *const *gc, dist_errbuf *eb) {
  int W = a->size, E = a->experts;
  for (int s = 0; s < W; s++)
    for (int r = 0; r < W; r++)
      for (int e = 0; e < E; e++) {
        long long sent = lc[s][r * E + e], expected = gc[r][s * E + e];
        if (sent == expected) continue;
        if (a->dir == DISTD_MOE_SCATTER)
          return dist_fail(eb, DIST_EINVAL, "global_count mismatch: rank %d sends "
                           "%lld rows for expert %d of rank %d, rank %d expects %lld",
                           a->group[s], sent, e, a->group[r], a->group[r], expected);
        return dist_fail(eb, DIST_EINVAL, "global_count mismatch: rank %d sends %lld "
                         "rows of its expert %d back to rank %d, rank %d expects %lld",
                         a->group[r], expected, e, a->group[s], a->group[s], sent);
      }
  return 0;
}

static int check_headers(const distd_moe_args *a, void **theirs,
                         const size_t *their_len, dist_errbuf *eb) {
  int W = a->size, rc = 0;
  size_t n = (size_t)W * (size_t)a->experts;
  const int64_t **lc = calloc((size_t)W, sizeof *lc), **gc = calloc((size_t)W, sizeof *gc);
  if (!lc || !gc) {
    rc = dist_fail(eb, DIST_ENOMEM, "out of memory checking MoE counts");
    goto out;
  }
  for (int j = 0; j < W; j++) {
    if (j == a->me) {
      lc[j] = a->local_count, gc[j] = a->global_count;
      continue;
    }
    if ((rc = check_fixed(a, j, theirs[j], their_len[j], eb)) != 0) goto out;
    lc[j] = (const int64_t *)((const uint8_t *)theirs[j] + sizeof(header_fixed));
    gc[j] = lc[j] + n;
  }
  rc = check_matrix(a, lc, gc, eb);
out:
  free(lc);
  free(gc);
  return rc;
}

/* Receives first, so rows arriving early land in place; zero-row chunks
 * travel as nothing (the headers already carry their counts). Each rank
 * sends to me+1, me+2, ... in turn (as coll.c's all-to-all does): in group
 * order every rank would write to rank 0 first, and the first receiver
 * would be the bottleneck while the others idle. */
static void post_rows(const distd_moe_args *a, const plan *p, distd_xfer *x,
                      const void *in, void *out) {
  int E = a->experts;
  size_t rb = a->row_bytes;
  for (int j = 0; j < a->size; j++)
    for (int e = 0; j != a->me && e < E; e++) {
      int i = j * E + e;
      if (p->recv_count[i])
        distd_xfer_recv(x, a->group[j], TAG_DATA + (uint32_t)e,
                        (uint8_t *)out + (size_t)p->recv_off[i] * rb,
                        (size_t)p->recv_count[i] * rb);
    }
  for (int k = 1; k < a->size; k++)
    for (int e = 0, j = (a->me + k) % a->size; e < E; e++) {
      int i = j * E + e;
      if (p->send_count[i])
        distd_xfer_send(x, a->group[j], TAG_DATA + (uint32_t)e,
                        (const uint8_t *)in + (size_t)p->send_off[i] * rb,
                        (size_t)p->send_count[i] * rb);
    }
}

/* The self part. A self chunk whose counts disagree is skipped: the header
 * check reports it. */
static void copy_self(const distd_moe_args *a, const plan *p, const void *in,
                      void *out) {
  size_t rb = a->row_bytes;
  for (int e = 0; e < a->experts; e++) {
    int i = a->me * a->experts + e;
    if (p->send_count[i] != p->recv_count[i] || !p->send_count[i]) continue;
    memcpy((uint8_t *)out + (size_t)p->recv_off[i] * rb,
           (const uint8_t *)in + (size_t)p->send_off[i] * rb,
           (size_t)p->send_count[i] * rb);
  }
}

static int exchange_run(const distd_moe_args *a, const void *in, void *out,
                        dist_errbuf *eb) {
  int W = a->size, n = W * a->experts, rc = 0;
  size_t hlen = header_len(W, a->experts);
  int64_t *offs = malloc(2 * (size_t)n * sizeof *offs);
  uint8_t *mine = malloc(hlen);
  void **theirs = calloc((size_t)W, sizeof *theirs);
  size_t *their_len = calloc((size_t)W, sizeof *their_len);
  distd_xfer *hx = distd_xfer_new(a->peers, a->op_id);
  distd_xfer *dx = distd_xfer_new(a->peers, a->op_id);
  if (!offs || !mine || !theirs || !their_len || !hx || !dx) {
    rc = distd_abort_no_memory(a->peers, a->op_id, a->group, a->size, op_name(a->dir), eb);
    goto out;
  }
  distd_xfer_sign(hx, a->signature, distd_op_signature_name);
  distd_xfer_sign(dx, a->signature, distd_op_signature_name);
  plan p;
  make_plan(a, offs, &p);
  build_header(a, mine);
  /* Each header waits to leave with the first rows to the same member (one
   * writev), or at the wait when there are none. */
  for (int j = 0; j < W; j++) {
    if (j == a->me) continue;
    distd_xfer_send_deferred(hx, a->group[j], TAG_HEADER, mine, hlen);
    distd_xfer_recv_any(hx, a->group[j], TAG_HEADER, &theirs[j], &their_len[j], hlen);
  }
  post_rows(a, &p, dx, in, out);
  copy_self(a, &p, in, out);
  /* The rows beyond what the sockets took at once stay with this thread
   * for dx's wait. Handed to the loop thread at the end of hx's short
   * wait, they were written from another CPU against dx's reads: the
   * loop thread's system calls per run 450-670 -> 145-160 (as in an
   * all-to-all), and W=2 16 MiB 6274 / 6552 -> 4797 / 5288 us in
   * alternating launches. And while hx waits for a member's counts, the
   * rows that follow them are read straight into place (the counts'
   * length, hlen, is known). */
  distd_xfer_then(hx, dx);
  distd_xfer *last = hx; /* the one waited on last: its failure is told */
  rc = distd_xfer_wait(hx, a->deadline_ms, eb);
  if (rc == 0) rc = check_headers(a, theirs, their_len, eb);
  if (rc == 0) last = dx, rc = distd_xfer_wait(dx, a->deadline_ms, eb);
  /* Both xfers carry the op id, so an ABORT from a peer failed both and
   * distd_xfer_abort does not echo it. */
  if (rc != 0) distd_xfer_abort(last, a->group, a->size, eb->msg);
out:
  distd_xfer_free(hx);
  distd_xfer_free(dx);
  for (int j = 0; theirs && j < W; j++) free(theirs[j]);
  free(theirs);
  free(their_len);
  free(mine);
  free(offs);
  return rc;
}

/* ---- inspection: the operations registry and per-expert token counts
 * (ops.h, expert_stats.h) ---- */

static uint64_t sum_counts(const int64_t *v, int n) {
  uint64_t t = 0;
  for (int i = 0; i < n; i++) t += (uint64_t)v[i];
  return t;
}

/* After a scatter, local expert e of this rank received global_count[r*E+e]
 * rows from each member r: its tokens of this step. */
static void record_expert_tokens(const distd_moe_args *a) {
  distd_expert_stats *st = distd_ops_experts(distd_peers_ops(a->peers));
  int E = a->experts;
  for (int e = 0; st && e < E; e++) {
    uint64_t rows = 0;
    for (int r = 0; r < a->size; r++) rows += (uint64_t)a->global_count[r * E + e];
    distd_expert_stats_record(st, a->me * E + e, rows);
  }
}

int distd_moe_exchange(const distd_moe_args *a, const void *in, void *out,
                       dist_errbuf *eb) {
  distd_ops *ops = distd_peers_ops(a->peers);
  const int64_t *in_count = a->dir == DISTD_MOE_SCATTER ? a->local_count : a->global_count;
  uint64_t bytes = sum_counts(in_count, a->size * a->experts) * a->row_bytes;
  uint64_t serial = distd_ops_begin(ops, op_name(a->dir), a->op_id, a->group, a->size, bytes);
  dist_errbuf why = DIST_ERRBUF_INIT;
  int rc = exchange_run(a, in, out, &why);
  if (rc == 0 && a->dir == DISTD_MOE_SCATTER && !a->gradient)
    record_expert_tokens(a);
  distd_ops_end(ops, serial, rc, why.msg);
  if (rc && eb) *eb = why;
  return rc;
}
