/* Elementwise formulas, written once: the CPU kernels (src/cpu) and the CUDA kernels
   (src/cuda) both expand these. Each is stamped for float (suffix _f, used for F32, F16 and
   BF16 storage: arithmetic in FP32) and double (suffix _d, for F64). */
#ifndef MT_MATH_SCALAR_OPS_H
#define MT_MATH_SCALAR_OPS_H
#include <math.h>
#include "hd.h"

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

MT_SCALAR_FORMULAS(float, f, expf, logf, sqrtf, erff, tanhf, fabsf, powf)
MT_SCALAR_FORMULAS(double, d, exp, log, sqrt, erf, tanh, fabs, pow)
#endif
