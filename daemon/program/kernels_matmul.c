/* matmul with numpy rules: float32 and float64 through OpenBLAS gemm (and
 * float16/bfloat16 through float32), integers with a plain loop in int64.
 * Batches broadcast; when only a has batch dims (the common x @ W), they
 * fold into the rows of one gemm call. */
#include <cblas.h>
#include <string.h>

#include "kernels.h"

typedef struct mm_dims {
  int64_t m, n, k;
  int64_t lda, ldb;
  dist_shape batch;                 /* output batch dims */
  int64_t a_st[DIST_MAX_DIMS];      /* element strides of a's batch (0: broadcast) */
  int64_t b_st[DIST_MAX_DIMS];
  int64_t a_mat, b_mat;             /* elements per matrix */
  int64_t nbatch;
} mm_dims;

static void batch_strides(const dist_shape *x, int64_t mat,
                          const dist_shape *batch, int64_t *st) {
  int xb = x->ndim > 2 ? x->ndim - 2 : 0;
  int64_t stride = mat;
  for (int d = batch->ndim - 1; d >= 0; d--) {
    int ix = xb - batch->ndim + d;
    int64_t dim = ix >= 0 ? x->dims[ix] : 1;
    st[d] = dim == 1 ? 0 : stride;
    stride *= dim;
  }
}

static void mm_plan(const dist_shape *a, const dist_shape *b, int ta, int tb,
                    const dist_shape *os, mm_dims *p) {
  memset(p, 0, sizeof *p);
  int64_t ar = a->ndim == 1 ? 1 : a->dims[a->ndim - 2];
  int64_t ac = a->dims[a->ndim - 1];
  int64_t br = b->ndim == 1 ? b->dims[0] : b->dims[b->ndim - 2];
  int64_t bc = b->ndim == 1 ? 1 : b->dims[b->ndim - 1];
  p->m = ta && a->ndim > 1 ? ac : ar;
  p->k = ta && a->ndim > 1 ? ar : ac;
  p->n = tb && b->ndim > 1 ? br : bc;
  p->lda = ac;
  p->ldb = bc;
  p->a_mat = ar * ac;
  p->b_mat = br * bc;
  p->batch = *os;
  p->batch.ndim = os->ndim - (a->ndim > 1) - (b->ndim > 1);
  p->nbatch = dist_shape_numel(&p->batch);
  batch_strides(a, p->a_mat, &p->batch, p->a_st);
  batch_strides(b, p->b_mat, &p->batch, p->b_st);
}

static void batch_offsets(const mm_dims *p, int64_t i, int64_t *oa,
                          int64_t *ob) {
  *oa = *ob = 0;
  for (int d = p->batch.ndim - 1; d >= 0; d--) {
    int64_t idx = i % p->batch.dims[d];
    i /= p->batch.dims[d];
    *oa += idx * p->a_st[d];
    *ob += idx * p->b_st[d];
  }
}

static void gemm(dist_dtype ct, int ta, int tb, int64_t m, int64_t n,
                 int64_t k, const void *a, int64_t lda, const void *b,
                 int64_t ldb, void *c) {
  if (m == 0 || n == 0 || k == 0) return; /* c is already zero */
  enum CBLAS_TRANSPOSE tra = ta ? CblasTrans : CblasNoTrans;
  enum CBLAS_TRANSPOSE trb = tb ? CblasTrans : CblasNoTrans;
  if (ct == DIST_FLOAT32) {
    cblas_sgemm(CblasRowMajor, tra, trb, (blasint)m, (blasint)n, (blasint)k,
                1.0f, a, (blasint)lda, b, (blasint)ldb, 0.0f, c, (blasint)n);
    return;
  }
  if (ct == DIST_FLOAT64) {
    cblas_dgemm(CblasRowMajor, tra, trb, (blasint)m, (blasint)n, (blasint)k,
                1.0, a, (blasint)lda, b, (blasint)ldb, 0.0, c, (blasint)n);
    return;
  }
  const int64_t *ia = a, *ib = b;
  int64_t *ic = c;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      uint64_t s = 0; /* wraps instead of overflowing */
      for (int64_t l = 0; l < k; l++) {
        int64_t x = ta ? ia[l * lda + i] : ia[i * lda + l];
        int64_t y = tb ? ib[j * ldb + l] : ib[l * ldb + j];
        s += (uint64_t)x * (uint64_t)y;
      }
      ic[i * n + j] = (int64_t)s;
    }
}

int distd_k_matmul(distd_tval *a, distd_tval *b, int ta, int tb,
                   distd_tval **out, dist_errbuf *eb) {
  distd_tval *ca = NULL, *cb = NULL, *res = NULL;
  dist_shape os;
  mm_dims p;
  *out = NULL;
  int rc = distd_shape_matmul(&a->shape, &b->shape, ta, tb, &os, eb);
  if (rc) return rc;
  if (a->dtype != b->dtype)
    return dist_fail(eb, DIST_EMISMATCH, "dtypes differ: %s vs %s",
                     dist_dtype_name(a->dtype), dist_dtype_name(b->dtype));
  if (a->dtype == DIST_BOOL)
    return dist_fail(eb, DIST_EINVAL, "bool operands need a cast first");
  dist_dtype ct = distd_compute_dtype(a->dtype);
  if ((rc = distd_tval_cast(a, ct, &ca, eb)) ||
      (rc = distd_tval_cast(b, ct, &cb, eb)) ||
      (rc = distd_tval_new(ct, &os, &res, eb)))
    goto out;
  ta = ta && a->shape.ndim > 1;
  tb = tb && b->shape.ndim > 1;
  mm_plan(&a->shape, &b->shape, ta, tb, &os, &p);
  size_t esz = dist_dtype_size(ct);
  int b_shared = 1;
  for (int d = 0; d < p.batch.ndim; d++)
    if (p.b_st[d]) b_shared = 0;
  int a_dense = 1; /* a's batches are all distinct and in order */
  for (int d = 0; d < p.batch.ndim; d++)
    if (p.a_st[d] == 0 && p.batch.dims[d] != 1) a_dense = 0;
  if (b_shared && a_dense && !ta) {
    gemm(ct, 0, tb, p.nbatch * p.m, p.n, p.k, ca->data, p.lda, cb->data,
         p.ldb, res->data);
  } else {
    for (int64_t i = 0; i < p.nbatch; i++) {
      int64_t oa, ob;
      batch_offsets(&p, i, &oa, &ob);
      gemm(ct, ta, tb, p.m, p.n, p.k, (char *)ca->data + (size_t)oa * esz,
           p.lda, (char *)cb->data + (size_t)ob * esz, p.ldb,
           (char *)res->data + (size_t)(i * p.m * p.n) * esz);
    }
  }
  rc = distd_tval_cast(res, a->dtype, out, eb);
out:
  distd_tval_unref(ca);
  distd_tval_unref(cb);
  distd_tval_unref(res);
  return rc;
}
