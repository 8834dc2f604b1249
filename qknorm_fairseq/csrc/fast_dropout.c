/* --fast-dropout on a CPU: each dropout pattern as one pass over memory, its mask drawn inside the
 * pass from the stream fast_dropout.py's numpy path draws (PCG64DXSM, four 16-bit draws per 64-bit
 * word, low bits first), kept for the backward as one byte per unit (ReLU's backward reads its
 * output instead).
 *
 * The arithmetic is torch's for the ops it replaces, so the bits are the same
 * (tests/unit/test_native.py): a product or sum of bf16 values is computed in fp32 and
 * rounded to the nearest even bf16; the mask's value is 1/keep rounded to the activations' dtype;
 * addcmul on bf16 multiplies, then adds, in fp32 (built with -ffp-contract=off, so no fused
 * multiply-add where torch has none), and on fp32 is one fused multiply-add, as torch's.
 *
 * Threads: OpenMP, the runtime torch loaded (the same libgomp.so.1), each thread on whole blocks
 * of draws from the state advanced to its first block (pcg.h). With AVX-512 the bf16 forwards and both
 * backwards run 16 elements at a time (simd.h), the same bits.
 */
#include "common.h"
#include "pcg.h"
#include "simd.h"

#define BLOCK 1024 /* draws a block: 256 words */

enum { MUL = 0, ADD = 1, RELU = 2 }; /* x * m, residual + x * m, relu(x) * m */

/* BODY on each block of N elements, the block's draws in DRAW, on THREADS threads (a variable of the
 * caller), each on its share of the blocks [first, last) of the stream at STATE. */
#define FOR_BLOCKS(N, ...)                                                       \
    int64_t nblocks_ = ((N) + BLOCK - 1) / BLOCK;                                          \
    _Pragma("omp parallel num_threads(threads)") {                                       \
        int nt_ = omp_get_num_threads(), t_ = omp_get_thread_num();                        \
        int64_t first = nblocks_ * t_ / nt_, last = nblocks_ * (t_ + 1) / nt_;             \
        u128 s_ = pcg_advance(state, inc, (uint64_t)first * (BLOCK / 4));                  \
        uint64_t words[BLOCK / 4];                                                         \
        const int16_t *draw = (const int16_t *)words;                                      \
        for (int64_t b_ = first; b_ < last; b_++) {                                        \
            pcg_words(&s_, inc, words, BLOCK / 4);                                         \
            int64_t off = b_ * BLOCK, len = (N) - off < BLOCK ? (N) - off : BLOCK;         \
            __VA_ARGS__                                                                    \
        }                                                                                  \
    }

/* The stream's state for SEED, as numpy's PCG64DXSM(SEED) starts it (pcg_seed_state), into OUT[4]. */
void qk_seed_state(uint64_t seed, uint64_t *out) { pcg_seed_state(seed, out); }

/* N draws of the stream, as numpy's random_raw viewed as int16 gives them. */
void qk_draws(int16_t *out, int64_t n, STATE_ARGS, int threads) {
    STATE_INIT
    FOR_BLOCKS(n, { memcpy(out + off, draw, (size_t)len * sizeof(int16_t)); })
}

/* BODY for each element j of each block, DRAWN whether its draw keeps it, M its mask's value. */
#define FOR_DRAWS(BODY)                                                   \
    BY_DTYPE(FOR_BLOCKS(n, {                                              \
        for (int64_t i = 0; i < len; i++) {                               \
            int64_t j = off + i;                                          \
            int drawn = draw[i] < threshold;                              \
            float m = drawn ? scale : 0.0f;                               \
            BODY;                                                         \
        }                                                                 \
    }))

#if QK_AVX512
/* FOR_DRAWS on bf16 (DT), 16 elements at a time: J the first, K those in the block, DRAWN those kept, M their mask's
 * values. (On fp32 the compiler's loops run as fast: memory-bound.) */
#define FOR_DRAWS16_BF16(...)                                                                  \
    {                                                                                          \
        const int DT = BF16;                                                                   \
        FOR_BLOCKS(n, {                                                                        \
            __m512 zero = _mm512_setzero_ps(), kept_scale = _mm512_set1_ps(scale);              \
            __m512i limit = _mm512_set1_epi32(threshold);                                      \
            for (int64_t i = 0; i < len; i += 16) {                                            \
                int64_t j = off + i;                                                           \
                __mmask16 k = first_lanes(len - i);                                            \
                __mmask16 drawn = vdrawn(draw + i, k, limit);                                  \
                __m512 m = _mm512_maskz_mov_ps(drawn, kept_scale);                             \
                __VA_ARGS__                                                                    \
            }                                                                                  \
        })                                                                                     \
    }
#endif

/* BODY for each element i < N, on THREADS threads. */
#define FOR_EACH(BODY)                                                    \
    BY_DTYPE(_Pragma("omp parallel for num_threads(threads) schedule(static)") \
             for (int64_t i = 0; i < n; i++) { BODY; })

#if QK_AVX512
/* BODY for each 16 elements from i < N (K: those below N; ZERO: a vector of zeros), on THREADS threads. */
#define FOR_CHUNKS(...)                                                                         \
    int64_t chunks_ = (n + 15) / 16;                                                             \
    BY_DTYPE(_Pragma("omp parallel for num_threads(threads) schedule(static)")                   \
             for (int64_t c_ = 0; c_ < chunks_; c_++) {                                           \
                 int64_t i = 16 * c_;                                                             \
                 __mmask16 k = first_lanes(n - i);                                                \
                 __m512 zero = _mm512_setzero_ps();                                               \
                 __VA_ARGS__                                                                          \
             })
#endif

static inline float relu(float v) { return v <= 0.0f ? 0.0f : v; } /* NaN stays NaN, as torch's */

/* y = x * m, residual + x * m or relu(x) * m (KIND), m = SCALE where the draw < THRESHOLD, else 0;
 * for x * m and residual + x * m, KEPT[j] = 1 where m is SCALE, for the backward. */
void qk_dropout_forward(int kind, int dtype, const void *x, const void *residual, void *y, uint8_t *kept, int64_t n,
                        STATE_ARGS, int threshold, float scale, int threads) {
    STATE_INIT
#if QK_AVX512
    if (dtype == BF16) {
        FOR_DRAWS16_BF16({
            __m512 v = vload(DT, x, j, k, zero);
            if (kind == RELU) {
                v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, zero, _CMP_LE_OQ), zero); /* relu */
            } else {
                vstore_kept(kept + j, k, drawn);
                if (kind == ADD) /* addmul on bf16 */
                    v = _mm512_add_ps(vload(DT, residual, j, k, zero), _mm512_mul_ps(v, m));
            }
            vstore(DT, y, j, k, kind == ADD ? v : _mm512_mul_ps(v, m));
        })
        return;
    }
#endif
    if (kind == RELU) {
        FOR_DRAWS(store(y, DT, j, relu(load(x, DT, j)) * m))
    } else if (kind == ADD) {
        FOR_DRAWS(kept[j] = drawn; store(y, DT, j, addmul(DT, load(residual, DT, j), load(x, DT, j), m)))
    } else {
        FOR_DRAWS(kept[j] = drawn; store(y, DT, j, load(x, DT, j) * m))
    }
}

/* The gradient through x * m: grad * m, m = SCALE where KEPT, else 0. */
void qk_dropout_backward(int dtype, const void *grad, const uint8_t *kept, void *out, int64_t n, float scale, int threads) {
#if QK_AVX512
    FOR_CHUNKS({
        __m512 m = _mm512_maskz_mov_ps(vkept(kept + i, k), _mm512_set1_ps(scale));
        vstore(DT, out, i, k, _mm512_mul_ps(vload(DT, grad, i, k, zero), m));
    })
#else
    FOR_EACH(store(out, DT, i, load(grad, DT, i) * (kept[i] ? scale : 0.0f)))
#endif
}

/* The gradient through relu(x) * m from its output Y: where y > 0 the mask was SCALE, so grad * SCALE
 * there, else 0 (threshold_backward of grad * m, whose test is y <= 0). One case differs: a NaN output
 * (x NaN, or +inf dropped) gets grad * SCALE where torch's ops give grad * m; fairseq stops a run with
 * NaN activations at its finite-gradient check either way. */
void qk_relu_dropout_backward(int dtype, const void *grad, const void *y, void *out, int64_t n, float scale,
                              int threads) {
#if QK_AVX512
    FOR_CHUNKS({
        __mmask16 positive = _mm512_cmp_ps_mask(vload(DT, y, i, k, zero), zero, _CMP_NLE_UQ); /* not y <= 0 */
        vstore(DT, out, i, k, _mm512_maskz_mul_ps(positive, vload(DT, grad, i, k, zero), _mm512_set1_ps(scale)));
    })
#else
    FOR_EACH(store(out, DT, i, load(y, DT, i) <= 0.0f ? 0.0f : load(grad, DT, i) * scale))
#endif
}
