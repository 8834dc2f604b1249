/* AVX-512 forms of common.h's loads, stores and roundings, 16 fp32 lanes at a time, for the loops whose
 * rows are too short for the compiler's own vectorisation to pay (a query's 40-60 keys: a 256-bit loop
 * and its masked remainder). The same bits as the scalar forms (common.h): bf16 widened exactly,
 * narrowed to the nearest even, a NaN becoming 0x7fc0. Without AVX-512 (F, BW, VL), or built with
 * -DQK_PORTABLE (native.load's portable build, which tests compare with), QK_AVX512 is 0 and the loops
 * keep their portable C.
 */
#ifndef QK_SIMD_H
#define QK_SIMD_H
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && !defined(QK_PORTABLE)
#define QK_AVX512 1
#include <immintrin.h>

#include "common.h"

_Static_assert(ROWS == 16 && LANES == 16, "vlane_sums: a row a lane, a lane an fp32 of one vector");

#define ALL_LANES ((__mmask16)0xffff)

/* the first N of 16 lanes (N <= 0: none) */
static inline __mmask16 first_lanes(int64_t n) {
    return n >= 16 ? ALL_LANES : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* 16 bf16 widened to fp32 (exactly) */
static inline __m512 vwiden(__m256i b) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)); }

/* P[I..I+16) as DTYPE holds them, widened to fp32; FILL in the lanes outside K */
static inline __m512 vload(int dtype, const void *p, int64_t i, __mmask16 k, __m512 fill) {
    if (dtype == BF16) {
        __m512 v = vwiden(_mm256_maskz_loadu_epi16(k, (const uint16_t *)p + i));
        return _mm512_mask_mov_ps(fill, k, v);
    }
    return _mm512_mask_loadu_ps(fill, k, (const float *)p + i);
}

/* V's bf16 bits in 32-bit lanes (f32_to_bf16) */
static inline __m512i bf16_bits(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
    return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
}

/* round_to, 16 lanes */
static inline __m512 vround_to(int dtype, __m512 v) {
    return dtype == BF16 ? _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(v), 16)) : v;
}

/* V rounded to DTYPE into the lanes K of P[I..I+16) */
static inline void vstore(int dtype, void *p, int64_t i, __mmask16 k, __m512 v) {
    if (dtype == BF16)
        _mm256_mask_storeu_epi16((uint16_t *)p + i, k, _mm512_cvtepi32_epi16(bf16_bits(v)));
    else
        _mm512_mask_storeu_ps((float *)p + i, k, v);
}

/* The lanes K whose draws (16 int16 from DRAW) fall below LIMIT (the threshold in 32-bit lanes: 32768, keep 1, keeps
 * every unit) */
static inline __mmask16 vdrawn(const int16_t *draw, __mmask16 k, __m512i limit) {
    return _mm512_mask_cmplt_epi32_mask(k, _mm512_cvtepi16_epi32(_mm256_maskz_loadu_epi16(k, draw)), limit);
}

/* The lanes K whose KEPT byte (16 from KEPT) is not 0 */
static inline __mmask16 vkept(const uint8_t *kept, __mmask16 k) {
    return _mm_test_epi8_mask(_mm_maskz_loadu_epi8(k, kept), _mm_set1_epi8(-1));
}

/* 1 or 0 (DRAWN or not) into the lanes K of KEPT[0..16) */
static inline void vstore_kept(uint8_t *kept, __mmask16 k, __mmask16 drawn) {
    _mm_mask_storeu_epi8(kept, k, _mm_maskz_set1_epi8(drawn, 1));
}

/* SUMS[q] = the sum of ACC[q]'s lanes in lane order, 0 + lane 0 + lane 1 + ..., for q < ROWS (ROWS_LANE_SUM's
 * last step): the rows side by side, a lane at a time */
static inline void vlane_sums(const __m512 *acc, float *sums) {
    float t[ROWS * 16];
    for (int q = 0; q < ROWS; q++)
        _mm512_storeu_ps(t + 16 * q, acc[q]);
    __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                      _mm512_set1_epi32(16));
    __m512 s = _mm512_setzero_ps();
    for (int k = 0; k < 16; k++)
        s = _mm512_add_ps(s, _mm512_i32gather_ps(_mm512_add_epi32(rows, _mm512_set1_epi32(k)), t, 4));
    _mm512_storeu_ps(sums, s);
}
#else
#define QK_AVX512 0
#endif
#endif
