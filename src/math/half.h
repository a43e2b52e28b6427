/* FP16 (IEEE binary16) and BF16 conversions with round-to-nearest-even, written once for the
   CPU and CUDA backends. The CPU backend also has F16C vector paths (src/cpu); these scalar
   versions are the reference they are tested against. */
#ifndef MT_MATH_HALF_H
#define MT_MATH_HALF_H
#include <stdint.h>
#include <string.h>
#include "hd.h"

/* The bits of a float and back (memcpy: no aliasing questions, and it vectorises). */
MT_HD uint32_t mt_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
MT_HD float mt_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* BF16 is the top half of an FP32; round to nearest even, keep NaN a (quiet) NaN. */
MT_HD uint16_t mt_f32_to_bf16(float f) {
    uint32_t u = mt_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
MT_HD float mt_bf16_to_f32(uint16_t h) {
    return mt_bits_f32((uint32_t)h << 16);
}

MT_HD uint16_t mt_f32_to_f16(float f) {
    uint32_t u = mt_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (abs > 0x7f800000u ? 0x0200u : 0u));
    if (abs >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) { /* result is subnormal or zero: scale by 2^24 and round */
        if (abs < 0x33000000u) return (uint16_t)sign; /* < 2^-25: rounds to zero */
        uint32_t e = abs >> 23;
        uint32_t m = (abs & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14 + (113 - e) - 1 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    /* normal: rebias exponent (127 -> 15), round mantissa 23 -> 10 bits to nearest even */
    uint32_t v = abs - 0x38000000u;
    v += 0xfffu + ((v >> 13) & 1u);
    return (uint16_t)(sign | (v >> 13));
}

MT_HD float mt_f16_to_f32(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    /* a NaN keeps its payload and is made quiet, as F16C's vcvtph2ps and torch */
    if (e == 0x1fu) return mt_bits_f32(sign | 0x7f800000u | (m ? 0x400000u : 0u) | (m << 13));
    if (e == 0) {
        if (m == 0) return mt_bits_f32(sign);
        /* subnormal: value m * 2^-24 */
        float v = (float)m * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return mt_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}
#endif
