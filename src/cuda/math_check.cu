// Compiles every formula of src/math for the device, with warnings as errors, so the
// write-once formulas stay valid CUDA while the CUDA backend (a later milestone) is built on
// them. It is compiled by nvcc into an object that nothing links: a build-time check, not a
// backend. Each kernel touches one family; none of them is launched.
#include "half.h"
#include "optim_math.h"
#include "philox.h"
#include "scalar_ops.h"

__global__ void mt_check_scalar_ops(float *f, double *d, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = f[i];
    f[i] = mt_relu_f(x) + mt_sigmoid_f(x) + mt_tanh_f(x) + mt_sign_f(x) + mt_rsqrt_f(x) +
           mt_gelu_f(x) + mt_gelu_grad_f(x) + mt_gelu_tanh_f(x) + mt_gelu_tanh_grad_f(x) +
           mt_exp_f(x) + mt_log_f(x) + mt_sqrt_f(x) + mt_abs_f(x) + mt_pow_f(x, 2.0f) +
           mt_max2_f(x, 1.0f) + mt_min2_f(x, 1.0f);
    double y = d[i];
    d[i] = mt_gelu_d(y) + mt_gelu_grad_d(y) + mt_gelu_tanh_grad_d(y) + mt_pow_d(y, 0.5);
}

__global__ void mt_check_half(const uint16_t *h, float *f, uint16_t *o, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    f[i] = mt_f16_to_f32(h[i]) + mt_bf16_to_f32(h[i]);
    o[i] = (uint16_t)(mt_f32_to_f16(f[i]) ^ mt_f32_to_bf16(f[i]));
}

__global__ void mt_check_philox(float *out, uint64_t seed, uint64_t offset, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = mt_philox_uniform(seed, offset, (uint64_t)i) + mt_philox_normal(seed, offset, (uint64_t)i);
}

__global__ void mt_check_optim(float *p, const float *g, float *m, float *v, double *dp,
                               const double *dg, double *dm, mt_optim_hyper h, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    mt_optim_consts_f c = mt_optim_narrow_f(&h);
    float gi = mt_optim_grad_f(g[i], p[i], c);
    p[i] = mt_sgd_update_f(p[i], gi, c);
    p[i] = mt_momentum_update_f(p[i], gi, &m[i], c, true);
    p[i] = mt_adam_update_f(p[i], gi, &m[i], &v[i], c);
    mt_optim_consts_d cd = mt_optim_narrow_d(&h);
    dp[i] = mt_adam_update_d(dp[i], mt_optim_grad_d(dg[i], dp[i], cd), &dm[i], &dm[i], cd);
}

__global__ void mt_check_loss_scale(double *scale, double *good, double *bad, double *skipped,
                                    bool found_inf) {
    mt_loss_scale_update(found_inf, scale, good, bad, skipped, 2.0, 0.5, 2000, 1, 1.0, 16777216.0);
}
