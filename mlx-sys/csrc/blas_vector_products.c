/* `cblas_sgemm` of liblmx_blas.so: a product whose output is one row or one column goes to
 * OpenBLAS's matrix-vector routine, the rest to its matrix product.
 *
 * MLX's CPU backend calls `cblas_sgemm` for every float32 product, decoding's one-row products
 * included. OpenBLAS packs both operands of any product too large for its small-matrix kernel, so
 * a one-row product reads each weight twice and writes it once more; `sgemv` reads it once.
 * OpenBLAS forwards such products itself only where it was built with GEMM_GEMV_FORWARD; the
 * scipy-openblas32 wheel lmx links packs them (docs/benchmarks.md). MLX passes row-major operands;
 * anything else goes to `sgemm` unchanged. */

#include <stddef.h>
#include <string.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

void scipy_cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                       const float *a, int lda, const float *b, int ldb, float beta, float *c,
                       int ldc);
void scipy_cblas_sgemv(int order, int trans, int m, int n, float alpha, const float *a, int lda,
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
    scipy_cblas_sgemv(ROW_MAJOR, trans, rows, cols, alpha, matrix, ld, x, incx, beta, y, incy);
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
    scipy_cblas_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
