/* Philox-4x32-10 counter-based RNG (Salmon et al., SC'11), as cuRAND and PyTorch use it.
   Element i of a draw with (seed, offset) is a pure function of (seed, offset + i / 4, i % 4),
   so every backend and any thread split produce the same numbers. */
#ifndef MT_MATH_PHILOX_H
#define MT_MATH_PHILOX_H
#include <math.h>
#include <stdint.h>
#include "hd.h"
#include "scalar_ops.h" /* mt_logv_f, mt_sincos_turns_f */

typedef struct {
    uint32_t v[4];
} mt_philox_block;

MT_HD uint32_t mt_mulhilo32(uint32_t a, uint32_t b, uint32_t *hi) {
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

MT_HD mt_philox_block mt_philox4x32(uint64_t counter, uint64_t seed) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = mt_mulhilo32(0xD2511F53u, c0, &hi0);
        uint32_t lo1 = mt_mulhilo32(0xCD9E8D57u, c2, &hi1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    mt_philox_block b = {{c0, c1, c2, c3}};
    return b;
}

/* The words of n consecutive blocks, counters first .. first + n - 1, block after block
   (out[4 b + lane]): mt_philox4x32 over a range in a loop without branches, which the
   compiler vectorises (a block per vector lane) where a kernel draws many words at once. */
MT_HD void mt_philox4x32_fill(uint64_t first, uint64_t seed, int64_t n, uint32_t *out) {
    for (int64_t b = 0; b < n; b++) {
        mt_philox_block blk = mt_philox4x32(first + (uint64_t)b, seed);
        out[4 * b] = blk.v[0];
        out[4 * b + 1] = blk.v[1];
        out[4 * b + 2] = blk.v[2];
        out[4 * b + 3] = blk.v[3];
    }
}

/* Uniform in [0, 1) with 24 random bits (exactly representable in FP32). */
MT_HD float mt_uint_to_unit_float(uint32_t x) {
    return (float)(x >> 8) * (1.0f / 16777216.0f);
}

/* Uniform in [0, 1) with `digits` random bits (<= 24): k * 2^-digits, exact in a dtype
   with that many significant digits (F16 11, BF16 8), so storing it there never rounds up
   to 1.0 as a 24-bit draw would (torch draws a dtype's own digits the same way). */
MT_HD float mt_uint_to_unit_digits(uint32_t x, int digits) {
    return (float)(x >> (32 - digits)) / (float)(1u << digits);
}

/* Element i of a uniform draw. */
MT_HD float mt_philox_uniform(uint64_t seed, uint64_t offset, uint64_t i) {
    mt_philox_block b = mt_philox4x32(offset + i / 4, seed);
    return mt_uint_to_unit_float(b.v[i % 4]);
}

/* Element i of a uniform draw with `digits` random bits. */
MT_HD float mt_philox_uniform_digits(uint64_t seed, uint64_t offset, uint64_t i, int digits) {
    mt_philox_block b = mt_philox4x32(offset + i / 4, seed);
    return mt_uint_to_unit_digits(b.v[i % 4], digits);
}

/* Lane `lane` of a normal draw from a block's words w[0..3]: Box-Muller on the lanes (0,1)
   and (2,3), with src/math's log and sin/cos of 2 pi u (not libm's, nor the GPU's own,
   which differ in the last bits): every device draws the same numbers, and the loop over a
   chunk vectorises. */
MT_HD_FMA float mt_box_muller_radius(uint32_t w) {
    float u1 = 1.0f - mt_uint_to_unit_float(w); /* (0, 1]: log is finite */
    return sqrtf(-2.0f * mt_logv_f(u1));
}
MT_HD_FMA float mt_philox_normal_lane(const uint32_t *w, unsigned lane) {
    unsigned pair = lane & 2u;
    float u2 = mt_uint_to_unit_float(w[pair + 1]);
    return mt_box_muller_radius(w[pair]) * mt_sincos_turns_f(u2, (int)(lane & 1u));
}

/* Element i of a normal draw. */
MT_HD_FMA float mt_philox_normal(uint64_t seed, uint64_t offset, uint64_t i) {
    mt_philox_block b = mt_philox4x32(offset + i / 4, seed);
    return mt_philox_normal_lane(b.v, (unsigned)(i % 4));
}
#endif
