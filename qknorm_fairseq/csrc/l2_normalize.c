/* --fused-kernels on a CPU: QKNorm's l2 normalisation of rows (each query's or key's head, D values
 * contiguous), forward and backward each one pass, fp32 or bf16 rows, fp32 arithmetic.
 *
 * Forward: y = x r, r = 1 / sqrt(max(s, floor)), s the sum of the row's squares (attention.py's
 * power_floor: the sum is floored, not the norm). R keeps r per row for the backward, negated where
 * the floor applied (there r is a constant).
 * Backward: dx = r dy - r^3 (dy . x) x, or r dy where the floor applied.
 *
 * Threads: OpenMP over rows; a row's sums run in fixed order, so the bits do not depend on them.
 */
#include <math.h>

#include "common.h"

void qk_l2_forward(int dtype, const void *x, void *y, float *r, int64_t rows, int64_t d, float floor_, int threads) {
    BY_DTYPE(
        _Pragma("omp parallel for num_threads(threads) schedule(static)")
        for (int64_t row = 0; row < rows; row++) {
            int64_t o = row * d;
            float s = LANE_SUM(d, load(x, DT, o + j) * load(x, DT, o + j));
            float ri = 1.0f / sqrtf(s < floor_ ? floor_ : s);
            for (int64_t j = 0; j < d; j++)
                store(y, DT, o + j, load(x, DT, o + j) * ri);
            r[row] = s < floor_ ? -ri : ri;
        })
}

void qk_l2_backward(int dtype, const void *x, const void *dy, const float *r, void *dx, int64_t rows, int64_t d,
                    int threads) {
    BY_DTYPE(
        _Pragma("omp parallel for num_threads(threads) schedule(static)")
        for (int64_t row = 0; row < rows; row++) {
            int64_t o = row * d;
            float ri = r[row];
            if (ri < 0.0f) {
                for (int64_t j = 0; j < d; j++)
                    store(dx, DT, o + j, -ri * load(dy, DT, o + j));
                continue;
            }
            float c = LANE_SUM(d, load(dy, DT, o + j) * load(x, DT, o + j)) * (ri * ri * ri);
            for (int64_t j = 0; j < d; j++)
                store(dx, DT, o + j, ri * load(dy, DT, o + j) - c * load(x, DT, o + j));
        })
}
