/* --fused-kernels on a CPU: LayerNorm over rows of D contiguous values, fp32 or bf16 (the weight and
 * bias in the rows' dtype), fp32 arithmetic, forward and backward each one pass over a row; alone, or
 * with --fast-dropout's residual dropout before it (a pre-norm layer's x = residual + dropout(y),
 * h = LayerNorm(x)) in the same pass.
 *
 * Forward: h = (x - mean) r w + b, r = 1 / sqrt(var + eps), the variance biased (torch's), both from
 * the row in fp32; MEAN and R keep them per row for the backward.
 * Backward, with xhat = (x - mean) r and g = dh w:
 *   dx = r (g - mean(g) - xhat mean(g xhat)),  dw = sum over rows of dh xhat,  db = sum of dh.
 * dw and db are summed in fp32 over blocks of BLOCK rows, the blocks then added in order, so that
 * neither their bits nor dx's depend on the thread count.
 *
 * With the dropout: x = residual + y m as fast_dropout.c's ADD computes it, m drawn from the same
 * stream at the same place (each row's draws start at row * D), KEPT[j] = 1 where m is SCALE. The
 * backward takes the gradient of x from its other readers (GX) beside that of h, and returns their
 * sum (the residual's gradient) and its product with m (y's gradient). Each value is rounded where the
 * unfused loops round it (LayerNorm's dx, the sum, the product), so the bits are those of
 * fast_dropout.c's loops with this file's LayerNorm (tests/unit/test_layer_norm.py). With AVX-512 the
 * backward runs 16 values at a time (simd.h; rows_backward16) where D is a multiple of 16, the same bits.
 */
#include <math.h>
#include <stdlib.h>

#include "common.h"
#include "pcg.h"
#include "simd.h"

#define BLOCK 64
_Static_assert(BLOCK % ROWS == 0, "the backward's sums end ROWS rows at a time within a block");

/* NR <= ROWS rows of X from ROW0 normalised into H; their means and 1 / stds into M, RI */
static inline void norm_rows(int DT, const void *restrict x, const void *restrict w, const void *restrict b,
                             void *restrict h, int64_t row0, int64_t nr, int64_t d, float eps, float *m, float *ri) {
    float mean[ROWS], var[ROWS];
    ROWS_LANE_SUM(nr, d, load(x, DT, (row0 + q) * d + j), mean);
    for (int q = 0; q < ROWS; q++)
        mean[q] /= (float)d;
    ROWS_LANE_SUM(nr, d, (load(x, DT, (row0 + q) * d + j) - mean[q]) * (load(x, DT, (row0 + q) * d + j) - mean[q]), var);
    for (int64_t q = 0; q < nr; q++) {
        int64_t o = (row0 + q) * d;
        float r = 1.0f / sqrtf(var[q] / (float)d + eps), mq = mean[q];
        for (int64_t j = 0; j < d; j++)
            store(h, DT, o + j, (load(x, DT, o + j) - mq) * r * load(w, DT, j) + load(b, DT, j));
        m[q] = mq;
        ri[q] = r;
    }
}

void qk_layer_norm_forward(int dtype, const void *restrict x, const void *restrict w, const void *restrict b,
                           void *restrict h, float *restrict mean, float *restrict r, int64_t rows, int64_t d, float eps,
                           int threads) {
    FOR_ROW_BLOCKS(rows, norm_rows(DT, x, w, b, h, r0, nr, d, eps, mean + r0, r + r0);)
}

void qk_dropout_add_norm_forward(int dtype, const void *restrict y, const void *restrict residual, void *restrict x,
                                 uint8_t *restrict kept, const void *restrict w, const void *restrict b, void *restrict h,
                                 float *restrict mean, float *restrict r, int64_t rows, int64_t d, float eps, STATE_ARGS,
                                 int threshold, float scale, int threads) {
    STATE_INIT
    int16_t *draw = malloc((size_t)(ROWS * d * threads) * sizeof(int16_t));
    BY_DTYPE(
        _Pragma("omp parallel num_threads(threads)") {
            int nt = omp_get_num_threads(), t = omp_get_thread_num();
            int64_t first = rows * t / nt, last = rows * (t + 1) / nt;
            int16_t *dr = draw + ROWS * d * t;
            draws_t stream;
            draws_from(&stream, state, inc, (uint64_t)(first * d));
            for (int64_t row0 = first; row0 < last; row0 += ROWS) {
                int64_t nr = last - row0 < ROWS ? last - row0 : ROWS, o = row0 * d;
                draws_next(&stream, dr, nr * d);
                for (int64_t j = 0; j < nr * d; j++) {
                    int drawn = dr[j] < threshold;
                    kept[o + j] = drawn;
                    store(x, DT, o + j, addmul(DT, load(residual, DT, o + j), load(y, DT, o + j), drawn ? scale : 0.0f));
                }
                norm_rows(DT, x, w, b, h, row0, nr, d, eps, mean + row0, r + row0);
            }
        })
    free(draw);
}

#if QK_AVX512
/* The backward's rows ROW0..END (the scalar loops' arithmetic, 16 values at a time; D a multiple of 16, so that
 * ADD_TO_LANES has no tail): dx (and dy), and their terms added to PW and PB. */
static inline void rows_backward16(int DT, const void *restrict dh, const void *restrict x, const float *restrict mean,
                                   const float *restrict r, const void *restrict w, const void *restrict gx,
                                   const uint8_t *restrict kept, float scale, void *restrict dx, void *restrict dy,
                                   float *restrict pw, float *restrict pb, int64_t row0, int64_t end, int64_t d) {
    const __m512 zero = _mm512_setzero_ps(), vscale = _mm512_set1_ps(scale);
    for (int64_t first = row0; first < end; first += ROWS) {
        int64_t nr = end - first < ROWS ? end - first : ROWS;
        __m512 acc_a[ROWS], acc_c[ROWS];
        float as[ROWS], cs[ROWS];
        for (int64_t q = 0; q < ROWS; q++) {
            acc_a[q] = acc_c[q] = zero;
            if (q >= nr)
                continue;
            int64_t o = (first + q) * d;
            __m512 m = _mm512_set1_ps(mean[first + q]), ri = _mm512_set1_ps(r[first + q]);
            for (int64_t j = 0; j < d; j += 16) {
                __m512 g = _mm512_mul_ps(vload(DT, dh, o + j, ALL_LANES, zero), vload(DT, w, j, ALL_LANES, zero));
                __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(vload(DT, x, o + j, ALL_LANES, zero), m), ri);
                acc_a[q] = _mm512_add_ps(acc_a[q], g);
                acc_c[q] = _mm512_add_ps(acc_c[q], _mm512_mul_ps(g, xhat));
            }
        }
        vlane_sums(acc_a, as);
        vlane_sums(acc_c, cs);
        for (int64_t q = 0; q < nr; q++) {
            int64_t o = (first + q) * d;
            __m512 m = _mm512_set1_ps(mean[first + q]), ri = _mm512_set1_ps(r[first + q]);
            __m512 a = _mm512_set1_ps(as[q] / (float)d), c = _mm512_set1_ps(cs[q] / (float)d);
            for (int64_t j = 0; j < d; j += 16) {
                __m512 vdh = vload(DT, dh, o + j, ALL_LANES, zero), xm = _mm512_sub_ps(vload(DT, x, o + j, ALL_LANES, zero), m);
                __m512 t = _mm512_sub_ps(_mm512_sub_ps(_mm512_mul_ps(vdh, vload(DT, w, j, ALL_LANES, zero)), a),
                                         _mm512_mul_ps(_mm512_mul_ps(xm, ri), c));
                __m512 v = _mm512_mul_ps(ri, t);
                if (kept == NULL) {
                    vstore(DT, dx, o + j, ALL_LANES, v);
                } else {
                    __m512 sum = vround_to(DT, _mm512_add_ps(vload(DT, gx, o + j, ALL_LANES, zero), vround_to(DT, v)));
                    vstore(DT, dx, o + j, ALL_LANES, sum);
                    vstore(DT, dy, o + j, ALL_LANES, _mm512_mul_ps(sum, _mm512_maskz_mov_ps(vkept(kept + o + j, ALL_LANES), vscale)));
                }
                _mm512_storeu_ps(pw + j, _mm512_add_ps(_mm512_loadu_ps(pw + j), _mm512_mul_ps(vdh, _mm512_mul_ps(xm, ri))));
                _mm512_storeu_ps(pb + j, _mm512_add_ps(_mm512_loadu_ps(pb + j), vdh));
            }
        }
    }
}
#endif

/* The backward of both (KEPT NULL: LayerNorm alone, GX unread, DY unwritten). */
void qk_layer_norm_backward(int dtype, const void *restrict dh, const void *restrict x, const float *restrict mean,
                            const float *restrict r, const void *restrict w, const void *restrict gx,
                            const uint8_t *restrict kept, float scale, void *restrict dx, void *restrict dy,
                            void *restrict dw, void *restrict db, int64_t rows, int64_t d, int threads) {
    int64_t blocks = (rows + BLOCK - 1) / BLOCK;
    float *partial = calloc((size_t)(2 * blocks * d), sizeof(float)); /* per block: dw's sums, then db's */
    BY_DTYPE(
        _Pragma("omp parallel for num_threads(threads) schedule(static)")
        for (int64_t block = 0; block < blocks; block++) {
            float *restrict pw = partial + 2 * block * d, *restrict pb = pw + d;
            int64_t end = (block + 1) * BLOCK < rows ? (block + 1) * BLOCK : rows;
            float as[ROWS], cs[ROWS];
#if QK_AVX512
            if (d % 16 == 0) {
                rows_backward16(DT, dh, x, mean, r, w, gx, kept, scale, dx, dy, pw, pb, block * BLOCK, end, d);
                continue;
            }
#endif
            for (int64_t row = block * BLOCK; row < end; row++) {
                int64_t o = row * d, q = (row - block * BLOCK) % ROWS;
                if (q == 0) {
                    int64_t nr = end - row < ROWS ? end - row : ROWS;
                    ROWS_LANE_SUM(nr, d, load(dh, DT, (row + q) * d + j) * load(w, DT, j), as);
                    ROWS_LANE_SUM(nr, d, load(dh, DT, (row + q) * d + j) * load(w, DT, j)
                                             * ((load(x, DT, (row + q) * d + j) - mean[row + q]) * r[row + q]), cs);
                }
                float m = mean[row], ri = r[row];
                float a = as[q] / (float)d, c = cs[q] / (float)d;
                if (kept == NULL) {
                    for (int64_t j = 0; j < d; j++)
                        store(dx, DT, o + j, ri * (load(dh, DT, o + j) * load(w, DT, j) - a - (load(x, DT, o + j) - m) * ri * c));
                } else {
                    for (int64_t j = 0; j < d; j++) {
                        float v = round_to(DT, ri * (load(dh, DT, o + j) * load(w, DT, j) - a - (load(x, DT, o + j) - m) * ri * c));
                        store(dx, DT, o + j, load(gx, DT, o + j) + v);
                    }
                    for (int64_t j = 0; j < d; j++)
                        store(dy, DT, o + j, load(dx, DT, o + j) * (kept[o + j] ? scale : 0.0f));
                }
                for (int64_t j = 0; j < d; j++) {
                    pw[j] += load(dh, DT, o + j) * ((load(x, DT, o + j) - m) * ri);
                    pb[j] += load(dh, DT, o + j);
                }
            }
        }
        _Pragma("omp parallel for num_threads(threads) schedule(static)")
        for (int64_t j = 0; j < d; j++) {
            float sw = 0.0f, sb = 0.0f;
            for (int64_t block = 0; block < blocks; block++) {
                sw += partial[2 * block * d + j];
                sb += partial[2 * block * d + d + j];
            }
            store(dw, DT, j, sw);
            store(db, DT, j, sb);
        })
    free(partial);
}
