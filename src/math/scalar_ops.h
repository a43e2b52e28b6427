/* Elementwise formulas, written once: the CPU kernels (src/cpu) and the CUDA kernels
   (src/cuda) both expand these. Each is stamped for float (suffix _f, used for F32, F16 and
   BF16 storage: arithmetic in FP32) and double (suffix _d, for F64). */
#ifndef MT_MATH_SCALAR_OPS_H
#define MT_MATH_SCALAR_OPS_H
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "half.h" /* mt_f32_bits, mt_bits_f32 */
#include "hd.h"

/* a * b + c with one rounding: C's fmaf, which is correctly rounded wherever it runs, so
   every CPU and the GPU compute the same bits. Code compiled for a CPU with FMA (the x86-64-v3
   and v4 clones of the CPU kernels, MT_CPU_CLONES in src/cpu/cpu.h) and CUDA get one
   instruction; code compiled for baseline x86-64 gets a libm call (hardware FMA behind it on
   the CPUs that have one), so a loop over these formulas belongs in a cloned function. */
#define MT_FMAF(a, b, c) fmaf((a), (b), (c))

/* ReLU's backward from its output y (or input: the same sign): the gradient g, zeroed where
   y <= 0, so a NaN y passes its gradient (torch's threshold_backward). For any arithmetic
   type: mt_relu's backward and the fused batch norm + ReLU kernels of both backends. */
#define MT_RELU_GRAD(g, y) ((y) <= 0 ? 0 : (g))

/* exp for float without a libm call, so that loops over it vectorise (libm's expf does not
   without -ffast-math): x = n ln2 + r, |r| <= ln2/2 (Cody-Waite, two-part ln2), a degree-6
   polynomial for e^r (SLEEF's expf_u10 coefficients), times 2^n applied in two halves so
   that results in the subnormal range round once. Within 1.3 ulp of the correctly rounded
   value; overflow gives inf, underflow 0, NaN stays NaN. The out-of-range cases are blended
   in with integer masks at the end: GCC will not if-convert a float select that follows
   arithmetic under the default -ftrapping-math, and a branch stops vectorisation.
   mt_expv_sum_f(hi, lo) is exp(hi + lo) where hi + lo is not representable: lo is added only
   after hi's range reduction, which is exact for a large hi (ln2_hi has 15 significant bits,
   so n ln2_hi is exact, and for |hi| >= 8 hi - n ln2_hi is a multiple of 2^-20 below 2), so
   erfc's -x^2 loses none of lo's bits.
   mt_expv_f(x) passes lo = -0, which the compiler drops (x + -0 is x for every x). */
MT_HD_FMA float mt_expv_sum_f(float hi, float lo) {
    float x = hi + lo; /* only for n and the out-of-range cases */
    /* n = round(x / ln2): adding 1.5 * 2^23 rounds to an integer held in the low mantissa
       bits, read back as an integer (no float-to-int conversion) */
    float t = MT_FMAF(x, 1.442695040888963407f, 12582912.0f), n = t - 12582912.0f;
    int32_t ti;
    memcpy(&ti, &t, sizeof ti);
    float r = MT_FMAF(n, -0.693145751953125f, hi) + lo;
    r = MT_FMAF(n, -1.428606765330187045e-06f, r);
    float p = 0.000198527617612853646278381f;
    p = MT_FMAF(p, r, 0.00139304355252534151077271f);
    p = MT_FMAF(p, r, 0.00833336077630519866943359f);
    p = MT_FMAF(p, r, 0.0416664853692054748535156f);
    p = MT_FMAF(p, r, 0.166666671633720397949219f);
    p = MT_FMAF(p, r, 0.5f);
    p = MT_FMAF(r * r, p, r + 1.0f);
    /* 2^n as two powers of two, each in the normal range for x in [-104, 89] */
    int32_t ni = ti - 0x4B400000, n1 = ni >> 1, n2 = ni - n1;
    uint32_t b1 = (uint32_t)(n1 + 127) << 23, b2 = (uint32_t)(n2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    float y = (p * s1) * s2;
    uint32_t ux, uy;
    memcpy(&ux, &x, sizeof ux);
    memcpy(&uy, &y, sizeof uy);
    uint32_t big = 0u - (uint32_t)((int32_t)ux > 0x42B20000),    /* x > 89: inf */
        small = 0u - (uint32_t)(ux > 0xC2D00000u),               /* x < -104: 0 */
        nan = 0u - (uint32_t)((ux & 0x7fffffffu) > 0x7f800000u); /* NaN: itself */
    uy = (uy & ~big) | (0x7f800000u & big);
    uy &= ~small;
    uy = (uy & ~nan) | (ux & nan);
    memcpy(&y, &uy, sizeof y);
    return y;
}

MT_HD_FMA float mt_expv_f(float x) {
    return mt_expv_sum_f(x, -0.0f);
}

/* mask ? a : b on bit patterns, mask all ones or all zeros */
MT_HD uint32_t mt_blend(uint32_t mask, uint32_t a, uint32_t b) {
    return (a & mask) | (b & ~mask);
}
MT_HD uint32_t mt_mask(int cond) {
    return 0u - (uint32_t)(cond != 0);
}

/* tanh for float, vectorisable: below |x| = 0.625 an odd polynomial (Cephes tanhf), above
   1 - 2 / (exp(2|x|) + 1) with the sign put back. Within 2 ulp; NaN stays NaN. */
MT_HD_FMA float mt_tanhv_f(float x) {
    uint32_t ux = mt_f32_bits(x), ua = ux & 0x7fffffffu;
    float s = x * x;
    float p = MT_FMAF(-5.70498872745e-3f, s, 2.06390887954e-2f);
    p = MT_FMAF(p, s, -5.37397155531e-2f);
    p = MT_FMAF(p, s, 1.33314422036e-1f);
    p = MT_FMAF(p, s, -3.33332819422e-1f);
    /* the sign put back on the polynomial too: at x = -0, p * s * x + x is +0 */
    float small = mt_bits_f32(mt_f32_bits(MT_FMAF(p * s, x, x)) | (ux & 0x80000000u));
    float e = mt_expv_f(mt_bits_f32(ua) * 2.0f);
    float large = 1.0f - 2.0f / (e + 1.0f);
    uint32_t ul = mt_f32_bits(large) | (ux & 0x80000000u);
    return mt_bits_f32(mt_blend(mt_mask(ua < 0x3f200000u), mt_f32_bits(small), ul));
}

/* log for float, vectorisable (Cephes logf): x = m 2^e with m in [sqrt(1/2), sqrt(2)), a
   degree-9 polynomial in m - 1, e ln2 added in two parts. Within 1 ulp of the correctly
   rounded value; subnormals are scaled first; log(0) = -inf, log(x < 0) = NaN, log(inf) =
   inf, NaN stays NaN. */
MT_HD_FMA float mt_logv_f(float x) {
    uint32_t ux = mt_f32_bits(x);
    uint32_t sub = mt_mask(ux < 0x00800000u); /* +0 and positive subnormals: scale by 2^23 */
    uint32_t u = mt_blend(sub, mt_f32_bits(x * 8388608.0f), ux);
    int32_t e = (int32_t)((u >> 23) & 0xffu) - 126 - (int32_t)(sub & 23u);
    uint32_t um = (u & 0x007fffffu) | 0x3f000000u; /* m in [0.5, 1) */
    uint32_t lo = mt_mask(um < 0x3f3504f3u);       /* m < sqrt(1/2): use 2m and e - 1 */
    float m = mt_bits_f32(um);
    float f = mt_bits_f32(mt_blend(lo, mt_f32_bits(m + m - 1.0f), mt_f32_bits(m - 1.0f)));
    float fe = (float)(e - (int32_t)(lo & 1u));
    float z = f * f;
    float p = 7.0376836292e-2f;
    p = MT_FMAF(p, f, -1.1514610310e-1f);
    p = MT_FMAF(p, f, 1.1676998740e-1f);
    p = MT_FMAF(p, f, -1.2420140846e-1f);
    p = MT_FMAF(p, f, 1.4249322787e-1f);
    p = MT_FMAF(p, f, -1.6668057665e-1f);
    p = MT_FMAF(p, f, 2.0000714765e-1f);
    p = MT_FMAF(p, f, -2.4999993993e-1f);
    p = MT_FMAF(p, f, 3.3333331174e-1f);
    float y = p * f * z;
    y = MT_FMAF(fe, -2.12194440e-4f, y);
    y = MT_FMAF(z, -0.5f, y);
    float r = MT_FMAF(fe, 0.693359375f, f + y);
    uint32_t ur = mt_f32_bits(r);
    ur = mt_blend(mt_mask((ux & 0x7fffffffu) == 0u), 0xff800000u, ur);        /* +-0: -inf */
    ur = mt_blend(mt_mask(ux > 0x80000000u), 0x7fc00000u, ur);                /* x < 0: NaN */
    ur = mt_blend(mt_mask((ux >= 0x7f800000u) & (ux < 0x80000000u)), ux, ur); /* inf, NaN */
    return mt_bits_f32(ur);
}

/* erfc for float, vectorisable: t = 1 / (1 + |x| / 2) and t exp(-x^2 + Q(t)) (the Chebyshev
   fit of Numerical Recipes' erfcc, relative error under 1.2e-7 for every x >= 0), with -x^2
   (split exactly into two floats by an FMA) and Q(t) summed inside exp's range reduction
   (mt_expv_sum_f) so that the large x^2 is not rounded into the polynomial, and 2 - erfc(-x)
   for x < 0. Within 6.6 ulp of erfc over every 13th float (the worst near x = 0.83);
   erfc(inf) = 0, erfc(-inf) = 2, NaN stays NaN. */
MT_HD_FMA float mt_erfcv_f(float x) {
    uint32_t ux = mt_f32_bits(x), ua = ux & 0x7fffffffu;
    /* |x| clamped at 10.5 (erfc underflows to 0 there) so that inf does not make NaN; the
       clamp is an integer min on the bits, which orders non-negative floats */
    float z = mt_bits_f32(ua < 0x41280000u ? ua : 0x41280000u);
    float t = 1.0f / MT_FMAF(0.5f, z, 1.0f);
    float q = 0.17087277f;
    q = MT_FMAF(q, t, -0.82215223f);
    q = MT_FMAF(q, t, 1.48851587f);
    q = MT_FMAF(q, t, -1.13520398f);
    q = MT_FMAF(q, t, 0.27886807f);
    q = MT_FMAF(q, t, -0.18628806f);
    q = MT_FMAF(q, t, 0.09678418f);
    q = MT_FMAF(q, t, 0.37409196f);
    q = MT_FMAF(q, t, 1.00002368f);
    q = MT_FMAF(q, t, -1.26551223f);
    float zz = z * z;
    float zz_lo = MT_FMAF(z, z, -zz); /* z * z = zz + zz_lo exactly */
    float tail = t * mt_expv_sum_f(-zz, q - zz_lo);
    uint32_t r = mt_blend(mt_mask(ux > 0x80000000u), mt_f32_bits(2.0f - tail), mt_f32_bits(tail));
    return mt_bits_f32(mt_blend(mt_mask(ua > 0x7f800000u), ux, r));
}

/* sin(2 pi t) (want_sin) or cos(2 pi t), for |t| < 2^20, in turns so that the range reduction
   is exact: q = round(4 t), r = t - q / 4 in [-1/8, 1/8] (both products of t's own bits),
   Taylor polynomials of degree 9 and 10 in r for sin and cos of 2 pi r (the first omitted
   term is below 2^-28 of the result), and the quarter turn q picks and signs one of them.
   Within 1.7 ulp over every t = k / 2^24 in [0, 1) (test_elementwise.c checks every 7th to
   2 ulp); vectorisable, and written with MT_FMAF and plain arithmetic only, so that a GPU
   computes the same bits. */
MT_HD_FMA float mt_sincos_turns_f(float t, int want_sin) {
    float sh = MT_FMAF(t, 4.0f, 12582912.0f), q = sh - 12582912.0f;
    uint32_t k = mt_f32_bits(sh) + (want_sin ? 0u : 1u); /* cos(x) = sin(x + a quarter turn) */
    float r = MT_FMAF(q, -0.25f, t), r2 = r * r;
    float sp = 42.058693944897655f;
    sp = MT_FMAF(sp, r2, -76.70585975306136f);
    sp = MT_FMAF(sp, r2, 81.60524927607504f);
    sp = MT_FMAF(sp, r2, -41.341702240399755f);
    sp = MT_FMAF(sp, r2, 6.283185307179586f) * r;
    float cp = -26.42625678337438f;
    cp = MT_FMAF(cp, r2, 60.24464137187666f);
    cp = MT_FMAF(cp, r2, -85.45681720672748f);
    cp = MT_FMAF(cp, r2, 64.93939402266829f);
    cp = MT_FMAF(cp, r2, -19.739208802178716f);
    cp = MT_FMAF(cp, r2, 1.0f);
    uint32_t v = mt_blend(mt_mask(k & 1u), mt_f32_bits(cp), mt_f32_bits(sp));
    return mt_bits_f32(v ^ ((k & 2u) << 30)); /* quarter turns 2 and 3: negated */
}

#define MT_SCALAR_FORMULAS(T, S, EXP, LOG, SQRT, ERFC, TANH, FABS, POW)                            \
    MT_HD_FMA T mt_relu_##S(T x) {                                                                 \
        return x < (T)0 ? (T)0 : x;                                                                \
    } /* NaN propagates */                                                                         \
    MT_HD_FMA T mt_sigmoid_##S(T x) {                                                              \
        return (T)1 / ((T)1 + EXP(-x));                                                            \
    }                                                                                              \
    MT_HD_FMA T mt_tanh_##S(T x) {                                                                 \
        return TANH(x);                                                                            \
    }                                                                                              \
    MT_HD_FMA T mt_sign_##S(T x) {                                                                 \
        return (T)((x > (T)0) - (x < (T)0));                                                       \
    }                                                                                              \
    MT_HD_FMA T mt_rsqrt_##S(T x) {                                                                \
        return (T)1 / SQRT(x);                                                                     \
    }                                                                                              \
    /* gelu(x) = x * Phi(x), Phi the normal CDF (torch's approximate='none'), written with         \
       erfc, Phi(x) = erfc(-x / sqrt 2) / 2, which keeps its precision for negative x */           \
    MT_HD_FMA T mt_gelu_##S(T x) {                                                                 \
        return (T)0.5 * x * ERFC(x * (T)-0.70710678118654752440);                                  \
    }                                                                                              \
    MT_HD_FMA T mt_gelu_grad_##S(T x) {                                                            \
        T cdf = (T)0.5 * ERFC(x * (T)-0.70710678118654752440);                                     \
        T pdf = EXP((T)-0.5 * x * x) * (T)0.39894228040143267794;                                  \
        return cdf + x * pdf;                                                                      \
    }                                                                                              \
    /* approximate='tanh': 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */                      \
    MT_HD_FMA T mt_gelu_tanh_##S(T x) {                                                            \
        T inner = (T)0.79788456080286535588 * (x + (T)0.044715 * x * x * x);                       \
        return (T)0.5 * x * ((T)1 + TANH(inner));                                                  \
    }                                                                                              \
    MT_HD_FMA T mt_gelu_tanh_grad_##S(T x) {                                                       \
        T inner = (T)0.79788456080286535588 * (x + (T)0.044715 * x * x * x);                       \
        T t = TANH(inner);                                                                         \
        T dinner = (T)0.79788456080286535588 * ((T)1 + (T)3 * (T)0.044715 * x * x);                \
        return (T)0.5 * ((T)1 + t) + (T)0.5 * x * ((T)1 - t * t) * dinner;                         \
    }                                                                                              \
    MT_HD_FMA T mt_exp_##S(T x) {                                                                  \
        return EXP(x);                                                                             \
    }                                                                                              \
    MT_HD_FMA T mt_log_##S(T x) {                                                                  \
        return LOG(x);                                                                             \
    }                                                                                              \
    MT_HD_FMA T mt_sqrt_##S(T x) {                                                                 \
        return SQRT(x);                                                                            \
    }                                                                                              \
    MT_HD_FMA T mt_abs_##S(T x) {                                                                  \
        return FABS(x);                                                                            \
    }                                                                                              \
    MT_HD_FMA T mt_pow_##S(T x, T y) {                                                             \
        return POW(x, y);                                                                          \
    }                                                                                              \
    /* x ** p for a scalar p: square, sqrt and rsqrt where torch takes them, which differ from     \
       pow at -0 and -inf (sqrt(-0) = -0, pow(-0, 0.5) = +0) and so in gradients there */          \
    MT_HD_FMA T mt_pow_scalar_##S(T x, T p) {                                                      \
        return p == (T)2      ? x * x                                                              \
               : p == (T)0.5  ? SQRT(x)                                                            \
               : p == (T)-0.5 ? (T)1 / SQRT(x)                                                     \
                              : POW(x, p);                                                         \
    }                                                                                              \
    MT_HD_FMA T mt_max2_##S(T x, T y) {                                                            \
        return (x > y || x != x) ? x : y;                                                          \
    } /* NaN propagates */                                                                         \
    MT_HD_FMA T mt_min2_##S(T x, T y) {                                                            \
        return (x < y || x != x) ? x : y;                                                          \
    }

/* float: the vectorisable versions above; double: libm */
MT_SCALAR_FORMULAS(float, f, mt_expv_f, mt_logv_f, sqrtf, mt_erfcv_f, mt_tanhv_f, fabsf, powf)
MT_SCALAR_FORMULAS(double, d, exp, log, sqrt, erfc, tanh, fabs, pow)
#endif
