/* What the kernels share: their two dtypes, fp32 and bf16, read into and written from fp32
 * arithmetic (bf16 <-> fp32 as torch converts them: widening is exact; narrowing rounds to the
 * nearest even bf16, a NaN becoming 0x7fc0, c10::BFloat16's round_to_nearest_even), a sum in lanes,
 * the packed rows' sentence offsets, and OpenMP's thread queries. */
#ifndef QK_COMMON_H
#define QK_COMMON_H
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

int omp_get_num_threads(void);
int omp_get_thread_num(void);

#endif
