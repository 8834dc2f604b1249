/* bf16 <-> fp32 as torch converts them: widening is exact; narrowing rounds to the nearest even
 * bf16, a NaN becoming 0x7fc0 (c10::BFloat16's round_to_nearest_even). */
#ifndef QK_BF16_H
#define QK_BF16_H
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

#endif
