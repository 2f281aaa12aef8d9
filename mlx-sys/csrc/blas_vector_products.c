/* `cblas_sgemm` of liblmx_blas.so: a product whose output is one row or one column goes to
 * OpenBLAS's matrix-vector routine, the rest to its matrix product. Compiled with
 * LMX_BLAS_PREFIX set to the prefix of the BLAS's symbols (`scipy_` for the scipy-openblas32
 * wheel, empty for a system OpenBLAS linked right after this library).
 *
 * MLX's CPU backend calls `cblas_sgemm` for every float32 product, decoding's one-row products
 * included. OpenBLAS packs both operands of any product too large for its small-matrix kernel, so
 * a one-row product reads each weight twice and writes it once more; `sgemv` reads it once.
 * OpenBLAS forwards such products itself only where it was built with GEMM_GEMV_FORWARD; the
 * scipy-openblas32 wheel lmx links packs them (docs/benchmarks.md). MLX passes row-major operands;
 * anything else goes to `sgemm` unchanged. */

#include <stddef.h>
#include <string.h>

#define JOIN(prefix, name) prefix##name
#define PREFIXED(prefix, name) JOIN(prefix, name)
#define BLAS(name) PREFIXED(LMX_BLAS_PREFIX, name)

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

/* The Fortran product, through which the other products pass: with no prefix, `cblas_sgemm`
 * would name this very function. Its two trailing lengths are the hidden lengths of the
 * character arguments, which gfortran's BLAS reads and OpenBLAS's ignores. */
void BLAS(sgemm_)(const char *trans_a, const char *trans_b, const int *m, const int *n,
                  const int *k, const float *alpha, const float *a, const int *lda,
                  const float *b, const int *ldb, const float *beta, float *c, const int *ldc,
                  size_t trans_a_len, size_t trans_b_len);
void BLAS(cblas_sgemv)(int order, int trans, int m, int n, float alpha, const float *a, int lda,
                       const float *x, int incx, float beta, float *y, int incy);

/* y = alpha * op(matrix) x + beta * y over `len` entries of y at stride `incy`. With beta 0, y is
 * zeroed first: MLX hands over a fresh buffer, and whatever it holds (NaN included) must not reach
 * the result, however this OpenBLAS's `sgemv` treats a beta of 0. */
static void vector_product(int trans, int rows, int cols, float alpha, const float *matrix,
                           int ld, const float *x, int incx, float beta, float *y, int incy,
                           int len) {
    if (beta == 0.0f) {
        if (incy == 1) {
            memset(y, 0, sizeof(float) * (size_t)len);
        } else {
            for (int i = 0; i < len; i++) y[(size_t)i * incy] = 0.0f;
        }
    }
    BLAS(cblas_sgemv)(ROW_MAJOR, trans, rows, cols, alpha, matrix, ld, x, incx, beta, y, incy);
}

void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    if (order == ROW_MAJOR && k > 0 && m == 1 && n > 0) {
        /* c (1 x n) = a (1 x k) op(b): y = op(b)^T x, x the row of a. */
        int incx = trans_a == NO_TRANS ? 1 : lda;
        if (trans_b == NO_TRANS) {
            vector_product(TRANS, k, n, alpha, b, ldb, a, incx, beta, c, 1, n);
        } else {
            vector_product(NO_TRANS, n, k, alpha, b, ldb, a, incx, beta, c, 1, n);
        }
        return;
    }
    if (order == ROW_MAJOR && k > 0 && n == 1 && m > 0) {
        /* c (m x 1) = op(a) b (k x 1): y = op(a) x, x the column of b, y the column of c. */
        int incx = trans_b == NO_TRANS ? ldb : 1;
        if (trans_a == NO_TRANS) {
            vector_product(NO_TRANS, m, k, alpha, a, lda, b, incx, beta, c, ldc, m);
        } else {
            vector_product(TRANS, k, m, alpha, a, lda, b, incx, beta, c, ldc, m);
        }
        return;
    }
    /* Row-major c = op(a) op(b) is column-major c^T = op(b)^T op(a)^T: the operands swap, each
     * keeping its own transposition. */
    const char ta = trans_a == NO_TRANS ? 'N' : 'T', tb = trans_b == NO_TRANS ? 'N' : 'T';
    if (order == ROW_MAJOR) {
        BLAS(sgemm_)(&tb, &ta, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc, 1, 1);
    } else {
        BLAS(sgemm_)(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc, 1, 1);
    }
}
