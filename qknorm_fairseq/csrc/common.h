/* What the kernels share: their two dtypes, fp32 and bf16, read into and written from fp32
 * arithmetic (bf16 <-> fp32 as torch converts them: widening is exact; narrowing rounds to the
 * nearest even bf16, a NaN becoming 0x7fc0, c10::BFloat16's round_to_nearest_even), a sum in lanes,
 * the packed rows' sentence offsets, e^v for v <= 0, a row's max, and OpenMP's thread queries. */
#ifndef QK_COMMON_H
#define QK_COMMON_H
#include <math.h> /* INFINITY */
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (f != f)
        return 0x7fc0;
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

enum { F32 = 0, BF16 = 1 }; /* the dtype codes the Python side passes */

/* V as DTYPE holds it: rounded to bf16, or fp32 as it is */
static inline float round_to(int dtype, float v) { return dtype == BF16 ? bf16_to_f32(f32_to_bf16(v)) : v; }

static inline float load(const void *p, int dtype, int64_t i) {
    return dtype == BF16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void store(void *p, int dtype, int64_t i, float v) {
    if (dtype == BF16)
        ((uint16_t *)p)[i] = f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

/* The statement given twice, with DT the constant BF16 or F32 (from the variable dtype): each loop
 * compiled for its dtype. */
#define BY_DTYPE(...)        \
    if (dtype == BF16) {     \
        const int DT = BF16; \
        __VA_ARGS__          \
    } else {                 \
        const int DT = F32;  \
        __VA_ARGS__          \
    }

/* r + x m as torch's addcmul computes it: on fp32 one fused multiply-add, on bf16 a product and a sum in fp32 */
static inline float addmul(int dtype, float r, float x, float m) {
    return dtype == F32 ? __builtin_fmaf(x, m, r) : r + x * m;
}

#define LANES 16 /* fp32 partial sums: a vector's width */

/* LANES_ (a float[LANES], zeros) += TERM (an expression of j) for j < LEN, j's term into lane j mod LANES, a
 * tail past the last multiple of LANES into lane 0. */
#define ADD_TO_LANES(LANES_, LEN, TERM)                      \
    do {                                                     \
        int64_t i_ = 0;                                      \
        for (; i_ + LANES <= (LEN); i_ += LANES)             \
            for (int k_ = 0; k_ < LANES; k_++) {             \
                int64_t j = i_ + k_;                         \
                (LANES_)[k_] += TERM;                        \
            }                                                \
        for (; i_ < (LEN); i_++) {                           \
            int64_t j = i_;                                  \
            (LANES_)[0] += TERM;                             \
        }                                                    \
    } while (0)

/* The sum of TERM for j < LEN, through LANES fp32 partial sums (ADD_TO_LANES) added in lane order:
 * vectorised, and in a fixed order (the same bits on every call). */
#define LANE_SUM(LEN, TERM)                                  \
    ({                                                       \
        float lanes_[LANES] = {0};                           \
        ADD_TO_LANES(lanes_, LEN, TERM);                     \
        float s_ = 0.0f;                                     \
        for (int k_ = 0; k_ < LANES; k_++)                   \
            s_ += lanes_[k_];                                \
        s_;                                                  \
    })

#define ROWS 16 /* rows whose sums end side by side (ROWS_LANE_SUM) */

/* SUMS[q] = LANE_SUM(LEN, TERM) for each row q < NR <= ROWS (TERM an expression of q and j): the same bits,
 * but the rows' last steps, each row's LANES partial sums added in lane order, run in vectors across the
 * rows, where a row at a time waits on LANES dependent additions (short rows: a head's d values, a
 * query's keys). SUMS[q] for q >= NR is 0. */
#define ROWS_LANE_SUM(NR, LEN, TERM, SUMS)                   \
    do {                                                     \
        float rows_[LANES][ROWS] = {{0}};                    \
        for (int64_t q = 0; q < (NR); q++) {                 \
            float lanes_[LANES] = {0};                       \
            ADD_TO_LANES(lanes_, LEN, TERM);                 \
            for (int k_ = 0; k_ < LANES; k_++)               \
                rows_[k_][q] = lanes_[k_];                   \
        }                                                    \
        for (int q_ = 0; q_ < ROWS; q_++)                    \
            (SUMS)[q_] = 0.0f;                               \
        for (int k_ = 0; k_ < LANES; k_++)                   \
            for (int q_ = 0; q_ < ROWS; q_++)                \
                (SUMS)[q_] += rows_[k_][q_];                 \
    } while (0)

/* The statements for each block of at most ROWS of N rows, R0 its first row and NR its count, compiled
 * for each dtype (BY_DTYPE), on THREADS threads (a variable of the caller). */
#define FOR_ROW_BLOCKS(N, ...)                                                          \
    int64_t blocks_ = ((N) + ROWS - 1) / ROWS;                                          \
    BY_DTYPE(_Pragma("omp parallel for num_threads(threads) schedule(static)")          \
             for (int64_t b_ = 0; b_ < blocks_; b_++) {                                 \
                 int64_t r0 = b_ * ROWS, nr = (N) - r0 < ROWS ? (N) - r0 : ROWS;         \
                 __VA_ARGS__                                                            \
             })

/* FIRST[s]: sentence s's first row, from the LENGTHS of COUNT sentences */
static inline void first_rows(const int64_t *lengths, int64_t count, int64_t *first) {
    first[0] = 0;
    for (int64_t s = 0; s < count; s++)
        first[s + 1] = first[s] + lengths[s];
}

/* e^v's constants: 1/ln2, 1.5 2^23 (adding and subtracting it rounds to an integer), ln2 in two parts, and the
 * polynomial's coefficients, highest first (exp_nonpositive; softmax_dropout.c's 16-lane form, vexp_nonpositive,
 * the same operations) */
#define EXP_LOG2E 1.44269504088896341f
#define EXP_ROUND 12582912.0f
#define EXP_LN2_HI -0.693359375f
#define EXP_LN2_LO 2.12194440e-4f
static const float EXP_POLY[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f,
                                  1.6666665459e-1f, 5.0000001201e-1f};

static inline float exp_nonpositive(float v) {
    /* e^v for v <= 0, -inf or NaN */
    float c = v < -87.0f ? -87.0f : v; /* NaN stays NaN */
    float n = (c * EXP_LOG2E + EXP_ROUND) - EXP_ROUND; /* rounded to an integer */
    float r = __builtin_fmaf(n, EXP_LN2_LO, __builtin_fmaf(n, EXP_LN2_HI, c)); /* c - n ln2 */
    /* Horner's steps written out: a loop here keeps the compiler from vectorising the loops that call it */
    float p = __builtin_fmaf(EXP_POLY[0], r, EXP_POLY[1]);
    p = __builtin_fmaf(p, r, EXP_POLY[2]);
    p = __builtin_fmaf(p, r, EXP_POLY[3]);
    p = __builtin_fmaf(p, r, EXP_POLY[4]);
    p = __builtin_fmaf(p, r, EXP_POLY[5]);
    p = __builtin_fmaf(p, r * r, r + 1.0f);
    union { int32_t bits; float value; } two_n = {((int32_t)n + 127) << 23}; /* 2^n, n in [-126, 0] */
    return v < -87.0f ? 0.0f : p * two_n.value;
}

/* The largest of E[0..S), in LANES lanes (vectorised; a NaN passed over) */
static inline float row_max(const float *e, int64_t s) {
    float lanes[LANES], max = -INFINITY;
    for (int k = 0; k < LANES; k++)
        lanes[k] = -INFINITY;
    int64_t i = 0;
    for (; i + LANES <= s; i += LANES)
        for (int k = 0; k < LANES; k++)
            lanes[k] = e[i + k] > lanes[k] ? e[i + k] : lanes[k];
    for (; i < s; i++)
        lanes[0] = e[i] > lanes[0] ? e[i] : lanes[0];
    for (int half = LANES / 2; half > 0; half /= 2) /* a tree: a max is the same in any order */
        for (int k = 0; k < half; k++)
            lanes[k] = lanes[k + half] > lanes[k] ? lanes[k + half] : lanes[k];
    return lanes[0] > max ? lanes[0] : max;
}

int omp_get_num_threads(void);
int omp_get_thread_num(void);

#endif
