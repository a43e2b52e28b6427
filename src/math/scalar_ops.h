/* Elementwise formulas, written once: the CPU kernels (src/cpu) and the CUDA kernels
   (src/cuda) both expand these. Each is stamped for float (suffix _f, used for F32, F16 and
   BF16 storage: arithmetic in FP32) and double (suffix _d, for F64). */
#ifndef MT_MATH_SCALAR_OPS_H
#define MT_MATH_SCALAR_OPS_H
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "hd.h"

/* a * b + c, fused where the target has FMA (one rounding), else two roundings */
#if defined(__CUDACC__) || defined(__FMA__)
#define MT_FMAF(a, b, c) fmaf((a), (b), (c))
#else
#define MT_FMAF(a, b, c) ((a) * (b) + (c))
#endif

/* exp for float without a libm call, so that loops over it vectorise (libm's expf does not
   without -ffast-math): x = n ln2 + r, |r| <= ln2/2 (Cody-Waite, two-part ln2), a degree-6
   polynomial for e^r (SLEEF's expf_u10 coefficients), times 2^n applied in two halves so
   that results in the subnormal range round once. Within 1.3 ulp of the correctly rounded
   value; overflow gives inf, underflow 0, NaN stays NaN. The out-of-range cases are blended
   in with integer masks at the end: GCC will not if-convert a float select that follows
   arithmetic under the default -ftrapping-math, and a branch stops vectorisation. */
MT_HD float mt_expv_f(float x) {
    /* n = round(x / ln2): adding 1.5 * 2^23 rounds to an integer held in the low mantissa
       bits, read back as an integer (no float-to-int conversion) */
    float t = MT_FMAF(x, 1.442695040888963407f, 12582912.0f), n = t - 12582912.0f;
    int32_t ti;
    memcpy(&ti, &t, sizeof ti);
    float r = MT_FMAF(n, -0.693145751953125f, x);
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

#define MT_SCALAR_FORMULAS(T, S, EXP, LOG, SQRT, ERF, TANH, FABS, POW)                             \
    MT_HD T mt_relu_##S(T x) { return x < (T)0 ? (T)0 : x; } /* NaN propagates */                  \
    MT_HD T mt_sigmoid_##S(T x) { return (T)1 / ((T)1 + EXP(-x)); }                                \
    MT_HD T mt_tanh_##S(T x) { return TANH(x); }                                                   \
    MT_HD T mt_sign_##S(T x) { return (T)((x > (T)0) - (x < (T)0)); }                              \
    MT_HD T mt_rsqrt_##S(T x) { return (T)1 / SQRT(x); }                                           \
    /* gelu(x) = x * Phi(x), Phi the normal CDF (torch's approximate='none') */                    \
    MT_HD T mt_gelu_##S(T x) { return (T)0.5 * x * ((T)1 + ERF(x * (T)0.70710678118654752440)); }  \
    MT_HD T mt_gelu_grad_##S(T x) {                                                                \
        T cdf = (T)0.5 * ((T)1 + ERF(x * (T)0.70710678118654752440));                              \
        T pdf = EXP((T)-0.5 * x * x) * (T)0.39894228040143267794;                                  \
        return cdf + x * pdf;                                                                      \
    }                                                                                              \
    /* approximate='tanh': 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */                      \
    MT_HD T mt_gelu_tanh_##S(T x) {                                                                \
        T inner = (T)0.79788456080286535588 * (x + (T)0.044715 * x * x * x);                       \
        return (T)0.5 * x * ((T)1 + TANH(inner));                                                 \
    }                                                                                              \
    MT_HD T mt_gelu_tanh_grad_##S(T x) {                                                           \
        T inner = (T)0.79788456080286535588 * (x + (T)0.044715 * x * x * x);                       \
        T t = TANH(inner);                                                                         \
        T dinner = (T)0.79788456080286535588 * ((T)1 + (T)3 * (T)0.044715 * x * x);                \
        return (T)0.5 * ((T)1 + t) + (T)0.5 * x * ((T)1 - t * t) * dinner;                         \
    }                                                                                              \
    MT_HD T mt_exp_##S(T x) { return EXP(x); }                                                     \
    MT_HD T mt_log_##S(T x) { return LOG(x); }                                                     \
    MT_HD T mt_sqrt_##S(T x) { return SQRT(x); }                                                   \
    MT_HD T mt_abs_##S(T x) { return FABS(x); }                                                    \
    MT_HD T mt_pow_##S(T x, T y) { return POW(x, y); }                                             \
    MT_HD T mt_max2_##S(T x, T y) { return (x > y || x != x) ? x : y; } /* NaN propagates */      \
    MT_HD T mt_min2_##S(T x, T y) { return (x < y || x != x) ? x : y; }

MT_SCALAR_FORMULAS(float, f, mt_expv_f, logf, sqrtf, erff, tanhf, fabsf, powf)
MT_SCALAR_FORMULAS(double, d, exp, log, sqrt, erf, tanh, fabs, pow)
#endif
