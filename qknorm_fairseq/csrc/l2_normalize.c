/* --fused-kernels on a CPU: QKNorm's l2 normalisation of rows (each query's or key's head, D values
 * contiguous), forward and backward each one pass, fp32 or bf16 rows, fp32 arithmetic.
 *
 * Forward: y = x r, r = 1 / sqrt(max(s, floor)), s the sum of the row's squares (attention.py's
 * power_floor: the sum is floored, not the norm). R keeps r per row for the backward, negated where
 * the floor applied (there r is a constant).
 * Backward: dx = r dy - r^3 (dy . x) x, or r dy where the floor applied.
 *
 * To a grid: a length group's rows normalised straight into the group's grid (decoder_rows.py's
 * grids), the l2 loop and grids.c's copy as one pass each way; with a GAIN, each value then times
 * QKNorm's g, rounded as the unfused ops round (the normalised value, then its product), and the
 * backward gives g's gradient per (sentence, head), in LANES fp32 partial sums (torch's ops sum rounded products).
 *
 * Threads: OpenMP over blocks of ROWS rows, or over (sentence, head) pairs; a row's sums run in fixed
 * order (common.h's ROWS_LANE_SUM), so the bits do not depend on them. With AVX-512 each loop runs 16
 * values at a time (simd.h; vrow_dots, vrow_backward) where D is a multiple of 16, the same bits.
 */
#include <math.h>
#include <string.h>

#include "common.h"
#include "simd.h"

/* 1 / the norm whose square is SQ, SQ raised to FLOOR_ (the rows R marks negative) */
static inline float inverse_norm(float sq, float floor_) {
    return 1.0f / sqrtf(sq < floor_ ? floor_ : sq);
}

#if QK_AVX512
/* SUMS[q] = ROWS_LANE_SUM of A[AO + q AS + j] B[BO + q BS + j] over j < D (a multiple of 16: no tail) for q < NR
 * (TA, TB: the dtypes of A and B); 0 for q >= NR */
static inline void vrow_dots(int ta, const void *a, int64_t ao, int64_t as, int tb, const void *b, int64_t bo,
                             int64_t bs, int64_t nr, int64_t d, float *sums) {
    const __m512 zero = _mm512_setzero_ps();
    __m512 acc[ROWS];
    for (int64_t q = 0; q < ROWS; q++) {
        acc[q] = zero;
        for (int64_t j = 0; q < nr && j < d; j += 16)
            acc[q] = _mm512_add_ps(acc[q], _mm512_mul_ps(vload(ta, a, ao + q * as + j, ALL_LANES, zero),
                                                         vload(tb, b, bo + q * bs + j, ALL_LANES, zero)));
    }
    vlane_sums(acc, sums);
}

/* D values from DY (DTY) into DX at O: ri dy - c x as qk_l2_backward computes them, or -ri dy where RI < 0 */
static inline void vrow_backward(int DT, int dty, const void *dy, int64_t dyo, const void *x, void *dx, int64_t o,
                                 int64_t d, float ri, float dot) {
    const __m512 zero = _mm512_setzero_ps();
    if (ri < 0.0f) {
        for (int64_t j = 0; j < d; j += 16)
            vstore(DT, dx, o + j, ALL_LANES, _mm512_mul_ps(_mm512_set1_ps(-ri), vload(dty, dy, dyo + j, ALL_LANES, zero)));
        return;
    }
    __m512 vri = _mm512_set1_ps(ri), c = _mm512_set1_ps(dot * (ri * ri * ri));
    for (int64_t j = 0; j < d; j += 16)
        vstore(DT, dx, o + j, ALL_LANES, _mm512_sub_ps(_mm512_mul_ps(vri, vload(dty, dy, dyo + j, ALL_LANES, zero)),
                                                 _mm512_mul_ps(c, vload(DT, x, o + j, ALL_LANES, zero))));
}
#endif

void qk_l2_forward(int dtype, const void *x, void *y, float *r, int64_t rows, int64_t d, float floor_, int threads) {
    FOR_ROW_BLOCKS(rows,
        float sq[ROWS];
#if QK_AVX512
        if (d % 16 == 0) {
            vrow_dots(DT, x, r0 * d, d, DT, x, r0 * d, d, nr, d, sq);
            for (int64_t q = 0; q < nr; q++) {
                int64_t o = (r0 + q) * d;
                float ri = inverse_norm(sq[q], floor_);
                for (int64_t j = 0; j < d; j += 16)
                    vstore(DT, y, o + j, ALL_LANES, _mm512_mul_ps(vload(DT, x, o + j, ALL_LANES, _mm512_setzero_ps()), _mm512_set1_ps(ri)));
                r[r0 + q] = sq[q] < floor_ ? -ri : ri;
            }
            continue;
        }
#endif
        ROWS_LANE_SUM(nr, d, load(x, DT, (r0 + q) * d + j) * load(x, DT, (r0 + q) * d + j), sq);
        for (int64_t q = 0; q < nr; q++) {
            int64_t o = (r0 + q) * d;
            float ri = inverse_norm(sq[q], floor_);
            for (int64_t j = 0; j < d; j++)
                store(y, DT, o + j, load(x, DT, o + j) * ri);
            r[r0 + q] = sq[q] < floor_ ? -ri : ri;
        })
}

void qk_l2_backward(int dtype, const void *x, const void *dy, const float *r, void *dx, int64_t rows, int64_t d,
                    int threads) {
    FOR_ROW_BLOCKS(rows,
        float dot[ROWS];
#if QK_AVX512
        if (d % 16 == 0) {
            vrow_dots(DT, dy, r0 * d, d, DT, x, r0 * d, d, nr, d, dot);
            for (int64_t q = 0; q < nr; q++)
                vrow_backward(DT, DT, dy, (r0 + q) * d, x, dx, (r0 + q) * d, d, r[r0 + q], dot[q]);
            continue;
        }
#endif
        ROWS_LANE_SUM(nr, d, load(dy, DT, (r0 + q) * d + j) * load(x, DT, (r0 + q) * d + j), dot);
        for (int64_t q = 0; q < nr; q++) {
            int64_t o = (r0 + q) * d;
            float ri = r[r0 + q];
            if (ri < 0.0f) {
                for (int64_t j = 0; j < d; j++)
                    store(dx, DT, o + j, -ri * load(dy, DT, o + j));
                continue;
            }
            float c = dot[q] * (ri * ri * ri);
            for (int64_t j = 0; j < d; j++)
                store(dx, DT, o + j, ri * load(dy, DT, o + j) - c * load(x, DT, o + j));
        })
}

/* The statements for each (sentence S, head H) of a group, SH their pair's index, on THREADS threads; FIRST
 * the sentences' first rows, SCALED whether there is a GAIN, G its value. */
#define FOR_SENTENCE_HEADS(...)                                                                 \
    int64_t first[count + 1];                                                                   \
    first_rows(lengths, count, first);                                                          \
    int scaled = gain != NULL;                                                                  \
    float g = scaled ? *gain : 1.0f;                                                            \
    BY_DTYPE(_Pragma("omp parallel for num_threads(threads) schedule(static)")                  \
             for (int64_t sh = 0; sh < count * heads; sh++) {                                    \
                 int64_t s = sh / heads, h = sh % heads;                                         \
                 __VA_ARGS__                                                                     \
             })

/* X (tokens, HEADS, D): a group's rows, sentence by sentence, LENGTHS of COUNT; GRID (COUNT, HEADS, LENGTH, D)
 * their normalised values (times *GAIN, g as an fp32, unless GAIN is NULL), zeros at the pads; R (tokens,
 * HEADS) as qk_l2_forward's. */
void qk_l2_to_grid(int dtype, const void *x, void *grid, float *r, const int64_t *lengths, int64_t count, int64_t heads,
                   int64_t d, int64_t length, float floor_, const float *gain, int threads) {
    FOR_SENTENCE_HEADS(
        for (int64_t t0 = 0; t0 < lengths[s]; t0 += ROWS) {
            int64_t nr = lengths[s] - t0 < ROWS ? lengths[s] - t0 : ROWS, row0 = (first[s] + t0) * heads + h;
            float sq[ROWS];
#if QK_AVX512
            if (d % 16 == 0) {
                vrow_dots(DT, x, row0 * d, heads * d, DT, x, row0 * d, heads * d, nr, d, sq);
                for (int64_t q = 0; q < nr; q++) {
                    int64_t row = row0 + q * heads, o = row * d, go = (sh * length + t0 + q) * d;
                    float ri = inverse_norm(sq[q], floor_);
                    for (int64_t j = 0; j < d; j += 16) {
                        __m512 v = vround_to(DT, _mm512_mul_ps(vload(DT, x, o + j, ALL_LANES, _mm512_setzero_ps()), _mm512_set1_ps(ri)));
                        vstore(DT, grid, go + j, ALL_LANES, scaled ? _mm512_mul_ps(v, _mm512_set1_ps(g)) : v);
                    }
                    r[row] = sq[q] < floor_ ? -ri : ri;
                }
                continue;
            }
#endif
            ROWS_LANE_SUM(nr, d, load(x, DT, (row0 + q * heads) * d + j) * load(x, DT, (row0 + q * heads) * d + j), sq);
            for (int64_t q = 0; q < nr; q++) {
                int64_t row = row0 + q * heads, o = row * d, go = (sh * length + t0 + q) * d;
                float ri = inverse_norm(sq[q], floor_);
                for (int64_t j = 0; j < d; j++) {
                    float v = round_to(DT, load(x, DT, o + j) * ri);
                    store(grid, DT, go + j, scaled ? v * g : v);
                }
                r[row] = sq[q] < floor_ ? -ri : ri;
            }
        }
        int64_t size = DT == BF16 ? 2 : 4; /* 0.0f below: all bits 0 in either dtype */
        memset((char *)grid + (sh * length + lengths[s]) * d * size, 0, (size_t)((length - lengths[s]) * d * size));
    )
}

/* The gradient of qk_l2_to_grid's X from its grid's, DGRID, into DX (tokens, HEADS, D); with GAIN, DG
 * (COUNT, HEADS) g's gradient from each sentence's head, summed in LANES fp32 partial sums. */
void qk_l2_from_grid(int dtype, const void *x, const void *dgrid, const float *r, void *dx, const int64_t *lengths,
                     int64_t count, int64_t heads, int64_t d, int64_t length, const float *gain, float *dg, int threads) {
    FOR_SENTENCE_HEADS(
        float dy[ROWS * d], dgs[LANES] = {0};
#if QK_AVX512
        if (d % 16 == 0) {
            const __m512 zero = _mm512_setzero_ps();
            __m512 vdgs = zero;
            for (int64_t t0 = 0; t0 < lengths[s]; t0 += ROWS) {
                int64_t nr = lengths[s] - t0 < ROWS ? lengths[s] - t0 : ROWS, row0 = (first[s] + t0) * heads + h;
                for (int64_t q = 0; q < nr; q++) {
                    int64_t o = (row0 + q * heads) * d, go = (sh * length + t0 + q) * d;
                    float rn = r[row0 + q * heads];
                    __m512 vrn = _mm512_set1_ps(rn < 0.0f ? -rn : rn), vg = _mm512_set1_ps(g);
                    for (int64_t j = 0; j < d; j += 16) {
                        __m512 dgv = vload(DT, dgrid, go + j, ALL_LANES, zero);
                        if (scaled) {
                            __m512 y = vround_to(DT, _mm512_mul_ps(vload(DT, x, o + j, ALL_LANES, zero), vrn));
                            vdgs = _mm512_add_ps(vdgs, _mm512_mul_ps(dgv, y));
                            dgv = vround_to(DT, _mm512_mul_ps(dgv, vg));
                        }
                        _mm512_storeu_ps(dy + q * d + j, dgv);
                    }
                }
                float dot[ROWS];
                vrow_dots(F32, dy, 0, d, DT, x, row0 * d, heads * d, nr, d, dot);
                for (int64_t q = 0; q < nr; q++)
                    vrow_backward(DT, F32, dy, q * d, x, dx, (row0 + q * heads) * d, d, r[row0 + q * heads], dot[q]);
            }
            _mm512_storeu_ps(dgs, vdgs);
        } else
#endif
        for (int64_t t0 = 0; t0 < lengths[s]; t0 += ROWS) {
            int64_t nr = lengths[s] - t0 < ROWS ? lengths[s] - t0 : ROWS, row0 = (first[s] + t0) * heads + h;
            for (int64_t q = 0; q < nr; q++) {
                int64_t o = (row0 + q * heads) * d, go = (sh * length + t0 + q) * d;
                float *dq = dy + q * d;
                if (scaled) {
                    float rn = r[row0 + q * heads];
                    rn = rn < 0.0f ? -rn : rn;
                    ADD_TO_LANES(dgs, d, load(dgrid, DT, go + j) * round_to(DT, load(x, DT, o + j) * rn));
                    for (int64_t j = 0; j < d; j++)
                        dq[j] = round_to(DT, load(dgrid, DT, go + j) * g);
                } else {
                    for (int64_t j = 0; j < d; j++)
                        dq[j] = load(dgrid, DT, go + j);
                }
            }
            float dot[ROWS];
            ROWS_LANE_SUM(nr, d, dy[q * d + j] * load(x, DT, (row0 + q * heads) * d + j), dot);
            for (int64_t q = 0; q < nr; q++) {
                int64_t o = (row0 + q * heads) * d;
                const float *dq = dy + q * d;
                float ri = r[row0 + q * heads];
                if (ri < 0.0f) {
                    for (int64_t j = 0; j < d; j++)
                        store(dx, DT, o + j, -ri * dq[j]);
                    continue;
                }
                float c = dot[q] * (ri * ri * ri);
                for (int64_t j = 0; j < d; j++)
                    store(dx, DT, o + j, ri * dq[j] - c * load(x, DT, o + j));
            }
        }
        if (scaled) {
            float sum = 0.0f;
            for (int k = 0; k < LANES; k++)
                sum += dgs[k];
            dg[sh] = sum;
        }
    )
}
