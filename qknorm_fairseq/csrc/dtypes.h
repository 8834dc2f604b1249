/* The kernels' two dtypes, fp32 and bf16, read into and written from fp32 arithmetic: bf16 <-> fp32
 * as torch converts them (widening is exact; narrowing rounds to the nearest even bf16, a NaN
 * becoming 0x7fc0: c10::BFloat16's round_to_nearest_even). */
#ifndef QK_DTYPES_H
#define QK_DTYPES_H
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

static inline float load(const void *p, int dtype, int64_t i) {
    return dtype == BF16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void store(void *p, int dtype, int64_t i, float v) {
    if (dtype == BF16)
        ((uint16_t *)p)[i] = f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

/* STMT twice, with DT the constant BF16 or F32 (from the variable dtype): each loop compiled for its
 * dtype. */
#define BY_DTYPE(STMT)       \
    if (dtype == BF16) {     \
        const int DT = BF16; \
        STMT                 \
    } else {                 \
        const int DT = F32;  \
        STMT                 \
    }

#endif
