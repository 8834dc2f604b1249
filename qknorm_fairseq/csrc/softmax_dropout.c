/* --fused-kernels on a CPU: the attention's additive mask, softmax over keys and --fast-dropout's
 * dropout as one pass over the scores, and its backward as one pass: fp32 or bf16 scores, fp32
 * arithmetic, each output rounded once.
 *
 * Forward, per row of S scores x (a query's, of one head) and its mask row a (0 or -inf):
 *   y = softmax(x + a), rounded to the scores' dtype (saved for the backward);
 *   out = y m, m = SCALE where the row's draw < THRESHOLD, else 0 (KEPT: 1 where m is SCALE).
 * The draws are the stream's in the scores' memory order, as --fast-dropout's dropout of y would
 * draw them, so the kept units are the same as the unfused ops'. Without dropout (OUT NULL) only y.
 * e^v is Cephes' expf (a degree-6 polynomial after v = n ln2 + r, n the nearest integer; within 2 ulp of e^v),
 * where torch's softmax has its own vectorised exp: outputs differ from torch's in the last bit of
 * a bf16 now and then; below e^-87 (1.6e-38) a weight is 0.
 * Backward: dx = y (g m - sum(y g m)), g the gradient of OUT.
 *
 * Threads: OpenMP over rows; a thread starts its draws at its first row's first element (pcg.h),
 * so the bits do not depend on the threads. With AVX-512 both directions run 16 keys at a time
 * (simd.h; rows_forward16, rows_backward16), the same operations in the same order.
 */
#include <math.h> /* INFINITY */

#include "common.h"
#include "pcg.h"
#include "simd.h"

/* E (PADDED values) = the exponentials of row O of SCORES plus row MO of MASK, less their max, 0 past S. */
static inline void exponentials(int dtype, const void *scores, const void *mask, int64_t o, int64_t mo, int64_t s,
                                int64_t padded, float *e) {
    if (mask)
        for (int64_t j = 0; j < s; j++)
            e[j] = load(scores, dtype, o + j) + load(mask, dtype, mo + j);
    else
        for (int64_t j = 0; j < s; j++)
            e[j] = load(scores, dtype, o + j);
    for (int64_t j = s; j < padded; j++) /* the lanes' loops without a remainder: e^-inf = 0 */
        e[j] = -INFINITY;
    float max = row_max(e, padded);
    for (int64_t j = 0; j < padded; j++)
        e[j] = exp_nonpositive(e[j] - max);
}

#if QK_AVX512
/* exp_nonpositive, 16 lanes: the same operations, so the same bits */
static inline __m512 vexp_nonpositive(__m512 v) {
    __m512 floor_ = _mm512_set1_ps(-87.0f), round_ = _mm512_set1_ps(EXP_ROUND);
    __mmask16 low = _mm512_cmp_ps_mask(v, floor_, _CMP_LT_OQ);
    __m512 c = _mm512_mask_mov_ps(v, low, floor_);
    __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(c, _mm512_set1_ps(EXP_LOG2E)), round_), round_);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(EXP_LN2_LO), _mm512_fmadd_ps(n, _mm512_set1_ps(EXP_LN2_HI), c));
    __m512 p = _mm512_set1_ps(EXP_POLY[0]);
    for (int k = 1; k < 6; k++)
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_POLY[k]));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i two_n = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps((__mmask16)~low, p, _mm512_castsi512_ps(two_n));
}

/* The forward of NR <= ROWS rows of S scores from element O (the scalar loops' arithmetic, 16 keys at a time):
 * MO the rows' offsets in MASK, E (NR x PADDED floats) their exponentials, DRAW their draws. */
static inline void rows_forward16(int DT, const void *scores, const void *mask, const int64_t *mo, int64_t o,
                                  int64_t nr, int64_t s, int64_t padded, float *e, void *y, void *out, uint8_t *kept,
                                  const int16_t *draw, int threshold, float scale) {
    __m512 acc[ROWS], minus_inf = _mm512_set1_ps(-INFINITY), zero = _mm512_setzero_ps();
    for (int64_t q = 0; q < nr; q++) {
        float *eq = e + q * padded;
        __m512 max = minus_inf;
        for (int64_t j = 0; j < padded; j += 16) {
            __mmask16 k = first_lanes(s - j);
            __m512 x = vload(DT, scores, o + q * s + j, k, minus_inf);
            if (mask)
                x = _mm512_add_ps(x, vload(DT, mask, mo[q] + j, k, zero));
            max = _mm512_max_ps(x, max); /* x > max ? x : max, as row_max */
            _mm512_storeu_ps(eq + j, x);
        }
        __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(max));
        acc[q] = zero;
        for (int64_t j = 0; j < padded; j += 16) {
            __m512 x = vexp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(eq + j), m));
            acc[q] = _mm512_add_ps(acc[q], x);
            _mm512_storeu_ps(eq + j, x);
        }
    }
    for (int64_t q = nr; q < ROWS; q++)
        acc[q] = zero;
    float sums[ROWS];
    vlane_sums(acc, sums);
    __m512 kept_scale = _mm512_set1_ps(scale);
    __m512i limit = _mm512_set1_epi32(threshold);
    for (int64_t q = 0; q < nr; q++) {
        const float *eq = e + q * padded;
        int64_t oq = o + q * s;
        __m512 inv = _mm512_set1_ps(1.0f / sums[q]);
        for (int64_t j = 0; j < s; j += 16) {
            __mmask16 k = first_lanes(s - j);
            __m512 p = _mm512_mul_ps(_mm512_loadu_ps(eq + j), inv);
            if (out) {
                p = vround_to(DT, p);
                __mmask16 drawn = vdrawn(draw + q * s + j, k, limit);
                vstore(DT, y, oq + j, k, p);
                vstore(DT, out, oq + j, k, _mm512_mul_ps(p, _mm512_maskz_mov_ps(drawn, kept_scale)));
                vstore_kept(kept + oq + j, k, drawn);
            } else {
                vstore(DT, y, oq + j, k, p);
            }
        }
    }
}

/* G, the gradient of the softmax's output (the dropout's undone), for lanes K of the 16 elements from I */
static inline __m512 vgradient(int DT, const void *grad, const uint8_t *kept, int64_t i, __mmask16 k, float scale) {
    __m512 g = vload(DT, grad, i, k, _mm512_setzero_ps());
    if (!kept)
        return g;
    return _mm512_mul_ps(g, _mm512_maskz_mov_ps(vkept(kept + i, k), _mm512_set1_ps(scale)));
}

/* The backward of NR <= ROWS rows of S from element O (the scalar loops' arithmetic, 16 keys at a time; a row's
 * tail past its last 16 added to lane 0 one at a time, as ADD_TO_LANES adds it). */
static inline void rows_backward16(int DT, const void *grad, const void *y, const uint8_t *kept, void *dx, int64_t o,
                                   int64_t nr, int64_t s, float scale) {
    __m512 acc[ROWS], zero = _mm512_setzero_ps();
    int64_t full = s / 16 * 16;
    for (int64_t q = 0; q < ROWS; q++) {
        acc[q] = zero;
        if (q >= nr)
            continue;
        int64_t oq = o + q * s;
        for (int64_t j = 0; j < full; j += 16)
            acc[q] = _mm512_add_ps(acc[q], _mm512_mul_ps(vload(DT, y, oq + j, 0xffff, zero),
                                                         vgradient(DT, grad, kept, oq + j, 0xffff, scale)));
        if (full < s) {
            __mmask16 k = first_lanes(s - full);
            float terms[16], lane0 = _mm512_cvtss_f32(acc[q]);
            _mm512_storeu_ps(terms, _mm512_mul_ps(vload(DT, y, oq + full, k, zero),
                                                  vgradient(DT, grad, kept, oq + full, k, scale)));
            for (int64_t j = 0; j < s - full; j++)
                lane0 += terms[j];
            acc[q] = _mm512_mask_mov_ps(acc[q], 1, _mm512_set1_ps(lane0));
        }
    }
    float dots[ROWS];
    vlane_sums(acc, dots);
    for (int64_t q = 0; q < nr; q++) {
        int64_t oq = o + q * s;
        __m512 dot = _mm512_set1_ps(dots[q]);
        for (int64_t j = 0; j < s; j += 16) {
            __mmask16 k = first_lanes(s - j);
            __m512 g = vgradient(DT, grad, kept, oq + j, k, scale);
            vstore(DT, dx, oq + j, k, _mm512_mul_ps(vload(DT, y, oq + j, k, zero), _mm512_sub_ps(g, dot)));
        }
    }
}
#endif

/* Rows taken at a time (ROWS_LANE_SUM) for rows of WIDTH floats: ROWS, fewer where they would pass 64 KiB on
 * the thread's stack. */
static inline int64_t rows_at_a_time(int64_t width) {
    return width * ROWS <= 16384 ? ROWS : 16384 / width > 1 ? 16384 / width : 1;
}

/* SCORES (D0, D1, D2, S) contiguous; MASK (or NULL) with strides M0, M1, M2 over the first three
 * dims (0 where it broadcasts) and 1 over the last. */
void qk_softmax_dropout_forward(int dtype, const void *scores, const void *mask, int64_t m0, int64_t m1, int64_t m2,
                                void *y, void *out, uint8_t *kept, int64_t d0, int64_t d1, int64_t d2, int64_t s,
                                STATE_ARGS, int threshold, float scale, int threads) {
    STATE_INIT
    int64_t rows = d0 * d1 * d2, padded = (s + LANES - 1) / LANES * LANES;
    int64_t block = rows_at_a_time(padded);
    BY_DTYPE(_Pragma("omp parallel num_threads(threads)") {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t first = rows * t / nt, last = rows * (t + 1) / nt;
        draws_t stream;
        if (out)
            draws_from(&stream, state, inc, (uint64_t)(first * s));
        float e[block * padded], sums[ROWS];
        int16_t draw[out ? block * s : 1];
        int64_t i2 = first % d2, i1 = first / d2 % d1, i0 = first / d2 / d1; /* the row's index */
        for (int64_t r0 = first; r0 < last; r0 += block) {
            int64_t nr = last - r0 < block ? last - r0 : block, mo[block];
            for (int64_t q = 0; q < nr; q++) {
                mo[q] = i0 * m0 + i1 * m1 + i2 * m2;
                if (++i2 == d2) {
                    i2 = 0;
                    if (++i1 == d1) {
                        i1 = 0;
                        i0++;
                    }
                }
            }
            if (out)
                draws_next(&stream, draw, nr * s);
#if QK_AVX512
            rows_forward16(DT, scores, mask, mo, r0 * s, nr, s, padded, e, y, out, kept, draw, threshold, scale);
            continue;
#endif
            for (int64_t q = 0; q < nr; q++)
                exponentials(DT, scores, mask, (r0 + q) * s, mo[q], s, padded, e + q * padded);
            ROWS_LANE_SUM(nr, padded, e[q * padded + j], sums);
            for (int64_t q = 0; q < nr; q++) {
                int64_t o = (r0 + q) * s;
                const float *eq = e + q * padded;
                float inv = 1.0f / sums[q];
                if (out) {
                    const int16_t *dq = draw + q * s;
                    for (int64_t j = 0; j < s; j++) {
                        float p = round_to(DT, eq[j] * inv);
                        int drawn = dq[j] < threshold;
                        store(y, DT, o + j, p);
                        store(out, DT, o + j, p * (drawn ? scale : 0.0f));
                        kept[o + j] = drawn;
                    }
                } else {
                    for (int64_t j = 0; j < s; j++)
                        store(y, DT, o + j, eq[j] * inv);
                }
            }
        }
    })
}

/* GRAD, Y (rows, S) contiguous, KEPT as the forward wrote it (NULL: no dropout) into DX. */
void qk_softmax_dropout_backward(int dtype, const void *grad, const void *y, const uint8_t *kept, void *dx, int64_t rows,
                                 int64_t s, float scale, int threads) {
    int64_t block = rows_at_a_time(s), blocks = (rows + block - 1) / block;
    BY_DTYPE(_Pragma("omp parallel num_threads(threads)") {
        float g[block * s], dots[ROWS];
        _Pragma("omp for schedule(static)")
        for (int64_t b = 0; b < blocks; b++) {
            int64_t r0 = b * block, nr = rows - r0 < block ? rows - r0 : block, o = r0 * s;
#if QK_AVX512
            rows_backward16(DT, grad, y, kept, dx, o, nr, s, scale);
            continue;
#endif
            /* the mask's value as a product, not a choice: compiled as a branch on a random byte it
             * mispredicts on every other unit, and the loop took twice as long */
            for (int64_t j = 0; j < nr * s; j++)
                g[j] = load(grad, DT, o + j) * (kept ? (float)kept[o + j] * scale : 1.0f);
            ROWS_LANE_SUM(nr, s, load(y, DT, o + q * s + j) * g[q * s + j], dots);
            for (int64_t q = 0; q < nr; q++)
                for (int64_t j = 0; j < s; j++)
                    store(dx, DT, o + q * s + j, load(y, DT, o + q * s + j) * (g[q * s + j] - dots[q]));
        }
    })
}
