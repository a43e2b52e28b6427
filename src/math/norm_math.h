/* Batch norm's per-channel statistics, written once for the CPU kernels (NCHW and NHWC) and
   the CUDA kernel. The sums are shifted by k, one of the channel's own values, so that
   s2 / M - mean^2 does not cancel when |mean| >> std. The normalisation uses the biased
   variance and the running variance the unbiased one (torch's semantics). Callers round
   mean and var to their accumulation type before the running update, as torch does. */
#ifndef MT_MATH_NORM_MATH_H
#define MT_MATH_NORM_MATH_H
#include <stdbool.h>
#include <stdint.h>
#include "hd.h"

typedef struct {
    double shifted_mean; /* mean of x - k: subtracted after k, so x - mean stays exact */
    double mean;         /* k + shifted_mean */
    double var;          /* biased, clamped at 0 (rounding can make it slightly negative); a
                            NaN (an inf among the values) stays NaN, as in torch */
} mt_bn_moments;

/* From s1 = sum(x - k) and s2 = sum((x - k)^2) over the M values of a channel. */
MT_HD mt_bn_moments mt_bn_moments_from_sums(double s1, double s2, double k, int64_t M) {
    mt_bn_moments m;
    m.shifted_mean = s1 / (double)M;
    double dv = s2 / (double)M - m.shifted_mean * m.shifted_mean;
    m.mean = k + m.shifted_mean;
    m.var = dv < 0 ? 0 : dv; /* not dv > 0 ? dv : 0, which would turn NaN into 0 */
    return m;
}

MT_HD double mt_bn_running_mean(double running, double mean, double momentum) {
    return (1 - momentum) * running + momentum * mean;
}

/* Batch norm normalises by 1/sqrt(var + eps) in the accumulation dtype; in training, a
   constant channel with eps 0 gets 0 there instead, as torch's InvStd (inf would make the
   output and the gradient NaN). True when that is the case. */
MT_HD bool mt_bn_rstd_is_zero(bool training, double var, double eps) {
    return training && var == 0 && eps == 0;
}

/* The running variance takes the unbiased estimate: var * M / (M - 1). */
MT_HD double mt_bn_running_var(double running, double var, int64_t M, double momentum) {
    return (1 - momentum) * running + momentum * var * (double)M / (double)(M - 1);
}
#endif
