// The fake cuDNN's batch norm (see fake_cudnn.cpp for the rules) and activation descriptors:
// the checks and statistics, the training forward and backward, plain and fused (Ex, with
// their workspace and reserve-space size queries), and the inference. A plain call is checked and
// computed as the Ex call with bnOps BN and no z, activation, workspace or reserve space. The Ex
// calls enforce what cuDNN documents for bnOps with an activation: persistent spatial mode, NHWC
// fully packed HALF x, z and y, C a multiple of 4, a RELU descriptor, z given exactly for
// BN_ADD_ACTIVATION; a workspace and a reserve space at least the sizes the queries return.
// bnOps BN (the plain batch norm through the Ex calls) takes any layout and mode, no z or dz,
// and may pass NULL for the activation descriptor and, in the backward, for y and the bias
// (a y given must match x). The persistent mode's backward needs the saved mean and inverse
// variance (cuDNN documents them as not NULL there).
// The forward keeps the ReLU mask in the reserve space, one bit per element, and the backward
// reads it from there (as cuDNN's does); under bnOps BN in persistent mode the reserve space
// holds the batch statistics in double and the backward takes them from there. Either way a
// reserve space not carried from the forward to the backward gives wrong results.
#include "fake_cudnn_internal.h"

using namespace fakednn;

namespace {

// ---- batch norm, spatial mode: per channel over N, H and W, in double

// The validated shape of a call, by value (the descriptors may be destroyed while it is
// queued).
struct bn_shape {
    cudnnDataType_t dt, pdt;
    int n, c, h, w;
    int xs[4];
};

int64_t bn_at(const bn_shape &b, int n, int c, int h, int w) {
    return (int64_t)n * b.xs[0] + (int64_t)c * b.xs[1] + (int64_t)h * b.xs[2] +
           (int64_t)w * b.xs[3];
}

// x (and y, dy, dx: the same descriptor contents), the parameter descriptor 1 x C x 1 x 1 of
// float (double for DOUBLE x), the mode, epsilon, the blend factors as host pointers; runs
// the fault injection of api.
cudnnStatus_t bn_check(const char *api, cudnnHandle_t h, cudnnBatchNormMode_t mode,
                       cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t y,
                       cudnnTensorDescriptor_t p, double eps,
                       std::initializer_list<const void *> scalars, bn_shape *b) {
    cudnnStatus_t st;
    if ((st = check_handle(api, h)) || (st = injected(api)) || (st = check_tensor(api, "x", x)) ||
        (st = check_tensor(api, "y", y)) || (st = check_tensor(api, "bnScaleBiasMeanVar", p)))
        return st;
    if (mode != CUDNN_BATCHNORM_SPATIAL && mode != CUDNN_BATCHNORM_SPATIAL_PERSISTENT)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "%s: mode %d is not emulated", api, mode);
    // cuDNN documents BAD_PARAM for x or y not 4-d or 5-d, for x and y that differ and for a
    // parameter descriptor not 1 x C x 1 x 1 (x 1); this fake does not emulate 5-d.
    if (x->nd < 4 || x->nd > 5 || y->nd < 4 || y->nd > 5)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: x and y have %d and %d dims, not 4 or 5", api,
                    x->nd, y->nd);
    if (!same_desc(x, y))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: x and y (dx, dy) descriptors differ", api);
    if (x->nd != 4)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "%s: only 4-d batch norm is emulated", api);
    if (x->dt == CUDNN_DATA_BFLOAT16)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "%s: BFLOAT16 batch norm is not emulated", api);
    cudnnDataType_t want = x->dt == CUDNN_DATA_DOUBLE ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    if (p->nd != 4 || p->dt != want || p->dims[0] != 1 || p->dims[1] != x->dims[1] ||
        p->dims[2] != 1 || p->dims[3] != 1)
        return fail(CUDNN_STATUS_BAD_PARAM,
                    "%s: the parameter descriptor must be 1 x %d x 1 x 1 of %s", api, x->dims[1],
                    want == CUDNN_DATA_DOUBLE ? "DOUBLE" : "FLOAT");
    // PyTorch's bounds for cuDNN's spatial kernels, which put the batch in a grid dimension
    // (stricter than cuDNN 9 may be: a caller within them is safe either way)
    int nmax = std::strstr(api, "Inference") ? 65535 : 880801;
    if (x->dims[0] > nmax)
        return fail(CUDNN_STATUS_NOT_SUPPORTED,
                    "%s: batch %d is over %d, the most its kernels take", api, x->dims[0], nmax);
    if (!(eps >= CUDNN_BN_MIN_EPSILON))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: epsilon %g", api, eps);
    if ((st = check_host_scalars(api, scalars, CUDNN_STATUS_BAD_PARAM))) return st;
    b->dt = x->dt;
    b->pdt = want;
    b->n = x->dims[0];
    b->c = x->dims[1];
    b->h = x->dims[2];
    b->w = x->dims[3];
    for (int i = 0; i < 4; i++) b->xs[i] = x->strides[i];
    return CUDNN_STATUS_SUCCESS;
}

// Each activation-shaped pointer spans x's bytes, each parameter pointer C values.
cudnnStatus_t bn_memory(const char *api, const bn_shape &b,
                        std::initializer_list<std::pair<const char *, const void *>> xs,
                        std::initializer_list<std::pair<const char *, const void *>> ps) {
    const int d[4] = {b.n, b.c, b.h, b.w};
    size_t xb = span_bytes(d, b.xs, 4, b.dt), pb = static_cast<size_t>(b.c) * dtype_size(b.pdt);
    for (auto &e : xs) {
        cudnnStatus_t st = check_memory(api, e.first, e.second, xb);
        if (st != CUDNN_STATUS_SUCCESS) return st;
    }
    for (auto &e : ps) {
        cudnnStatus_t st = check_memory(api, e.first, e.second, pb);
        if (st != CUDNN_STATUS_SUCCESS) return st;
    }
    return CUDNN_STATUS_SUCCESS;
}

// The batch mean and biased variance of channel c.
void bn_stats(const bn_shape &b, const char *x, int c, double *mean, double *var) {
    double s = 0, q = 0;
    int64_t m = (int64_t)b.n * b.h * b.w;
    for (int n = 0; n < b.n; n++)
        for (int h = 0; h < b.h; h++)
            for (int w = 0; w < b.w; w++) s += load(x, b.dt, bn_at(b, n, c, h, w));
    *mean = s / m;
    for (int n = 0; n < b.n; n++)
        for (int h = 0; h < b.h; h++)
            for (int w = 0; w < b.w; w++) {
                double d = load(x, b.dt, bn_at(b, n, c, h, w)) - *mean;
                q += d * d;
            }
    *var = q / m;
}

// ---- the fused (Ex) calls' rules and sizes

const char *ops_name(cudnnBatchNormOps_t ops) {
    return ops == CUDNN_BATCHNORM_OPS_BN              ? "BN"
           : ops == CUDNN_BATCHNORM_OPS_BN_ACTIVATION ? "BN_ACTIVATION"
                                                      : "BN_ADD_ACTIVATION";
}

// The Ex rules on top of bn_check's: the ops, the activation, z against the ops.
cudnnStatus_t ex_check(const char *api, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t ops,
                       cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t z, bool z_given,
                       cudnnActivationDescriptor_t act) {
    if (ops != CUDNN_BATCHNORM_OPS_BN && ops != CUDNN_BATCHNORM_OPS_BN_ACTIVATION &&
        ops != CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: bnOps %d", api, ops);
    bool add = ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION;
    if (add != (z != nullptr) || add != z_given)
        return fail(CUDNN_STATUS_BAD_PARAM,
                    "%s: z (descriptor and data) is given exactly for "
                    "BN_ADD_ACTIVATION, bnOps %s",
                    api, ops_name(ops));
    if (ops == CUDNN_BATCHNORM_OPS_BN) return CUDNN_STATUS_SUCCESS;
    if (mode != CUDNN_BATCHNORM_SPATIAL_PERSISTENT)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "%s: bnOps %s needs SPATIAL_PERSISTENT mode", api,
                    ops_name(ops));
    if (x->dt != CUDNN_DATA_HALF || !packed(x, true) || x->dims[1] % 4 != 0)
        return fail(CUDNN_STATUS_NOT_SUPPORTED,
                    "%s: bnOps %s needs NHWC fully packed HALF x with C a multiple of 4 (C %d)",
                    api, ops_name(ops), x->dims[1]);
    if (add) {
        if (cudnnStatus_t st = check_tensor(api, "z", z)) return st;
        if (!same_desc(z, x))
            return fail(CUDNN_STATUS_BAD_PARAM, "%s: z and x descriptors differ", api);
    }
    if (cudnnStatus_t st = check_set(api, "activation", act)) return st;
    if (act->mode != CUDNN_ACTIVATION_RELU)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "%s: activation mode %d is not RELU", api,
                    act->mode);
    return CUDNN_STATUS_SUCCESS;
}

// The sizes the queries answer: per-channel partial sums for the workspaces; for an Ex call's
// reserve space the ReLU mask (one bit per element, in 32-bit words) with an activation, or the
// batch mean and inverse variance (double) per channel under bnOps BN in persistent mode.
size_t fwd_workspace(const cudnnTensorStruct *x) {
    return static_cast<size_t>(x->dims[1]) * 2 * sizeof(double);
}
size_t bwd_workspace(const cudnnTensorStruct *x) {
    return static_cast<size_t>(x->dims[1]) * 4 * sizeof(double);
}
bool stats_in_reserve(bool ex, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t ops) {
    return ex && ops == CUDNN_BATCHNORM_OPS_BN && mode == CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
}
size_t reserve_size(bool ex, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t ops,
                    const cudnnTensorStruct *x) {
    if (stats_in_reserve(ex, mode, ops))
        return static_cast<size_t>(x->dims[1]) * 2 * sizeof(double);
    if (ops == CUDNN_BATCHNORM_OPS_BN) return 0;
    size_t n = 1;
    for (int i = 0; i < x->nd; i++) n *= static_cast<size_t>(x->dims[i]);
    return (n + 31) / 32 * 4;
}

// A buffer of at least need bytes: the size given covers it and, when need > 0, the pointer
// is device memory of that size.
cudnnStatus_t sized(const char *api, const char *name, const void *p, size_t given, size_t need) {
    if (given < need)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: %s of %zu bytes, the query asked for %zu", api,
                    name, given, need);
    return need ? check_memory(api, name, p, given) : CUDNN_STATUS_SUCCESS;
}

// An Ex call's workspace (at least the query's bytes; a plain call needs none) and reserve
// space (at least what the query answers for mode and bnOps; none for a plain call).
cudnnStatus_t spaces(const char *api, bool ex, void *ws, size_t ws_bytes, size_t need,
                     cudnnBatchNormMode_t mode, cudnnBatchNormOps_t ops, const cudnnTensorStruct *x,
                     void *rs, size_t rs_bytes) {
    cudnnStatus_t st = sized(api, "workspace", ws, ws_bytes, ex ? need : 0);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    return sized(api, "reserveSpace", rs, rs_bytes, reserve_size(ex, mode, ops, x));
}

bool mask_bit(const char *r, int64_t i) {
    return (r[i / 8] >> (i % 8)) & 1;
}

// The element index (over the logical N, C, H, W order) that the mask bit of i stands for.
int64_t logical(const bn_shape &b, int n, int c, int h, int w) {
    return ((static_cast<int64_t>(n) * b.c + c) * b.h + h) * b.w + w;
}

// A backward's descriptors besides bn_check's: dx as x, and y as x with an activation (or
// when given: bnOps BN may pass NULL).
cudnnStatus_t bwd_descs(const char *api, bool act, cudnnTensorDescriptor_t x,
                        cudnnTensorDescriptor_t y, cudnnTensorDescriptor_t dx) {
    bool with_y = act || y != nullptr;
    cudnnStatus_t st = check_tensor(api, "dx", dx);
    if (st == CUDNN_STATUS_SUCCESS && with_y) st = check_tensor(api, "y", y);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (!same_desc(dx, x) || (with_y && !same_desc(y, x)))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: dx (or y) and x descriptors differ", api);
    return CUDNN_STATUS_SUCCESS;
}

// A size query's answer.
cudnnStatus_t answer(const char *api, size_t *out, size_t size) {
    if (!out) return fail(CUDNN_STATUS_BAD_PARAM, "%s: null size pointer", api);
    *out = size;
    return CUDNN_STATUS_SUCCESS;
}

// A pair of parameter pointers (running, saved statistics) is given whole or not at all.
cudnnStatus_t both_or_none(const char *api, const void *a, const void *b, const char *what) {
    if (!a == !b) return CUDNN_STATUS_SUCCESS;
    return fail(CUDNN_STATUS_BAD_PARAM, "%s: %s must both be given or both NULL", api, what);
}

const char *bytes(const void *p) {
    return static_cast<const char *>(p);
}
char *bytes(void *p) {
    return static_cast<char *>(p);
}

// ---- the training forward

// A training forward's data, by value (queued with the work): the inputs, the outputs, the
// optional statistics (running: updated; saved: written) and the reserve space (the ReLU mask).
struct fwd_data {
    const char *x, *z, *scale, *bias;
    char *y, *running_mean, *running_var, *save_mean, *save_inv_var, *reserve;
};
// Its scalars: the blend factors, the running average's factor, epsilon, the activation
// (a ReLU, propagating NaN or not), and whether the statistics go to the reserve space.
struct fwd_math {
    double alpha, beta, factor, eps;
    bool act, nan, stats_reserve;
};

// The forward's pointers: the statistics given in pairs, each pointer device memory of its
// size.
cudnnStatus_t fwd_check_data(const char *api, const bn_shape &b, const fwd_data &d) {
    cudnnStatus_t st =
        both_or_none(api, d.running_mean, d.running_var, "running mean and variance");
    if (st == CUDNN_STATUS_SUCCESS)
        st = both_or_none(api, d.save_mean, d.save_inv_var, "saved mean and inverse variance");
    if (st == CUDNN_STATUS_SUCCESS)
        st =
            bn_memory(api, b, {{"x", d.x}, {"y", d.y}}, {{"bnScale", d.scale}, {"bnBias", d.bias}});
    if (st == CUDNN_STATUS_SUCCESS && d.z) st = bn_memory(api, b, {{"z", d.z}}, {});
    if (st == CUDNN_STATUS_SUCCESS && d.running_mean)
        st = bn_memory(
            api, b, {},
            {{"resultRunningMean", d.running_mean}, {"resultRunningVariance", d.running_var}});
    if (st == CUDNN_STATUS_SUCCESS && d.save_mean)
        st =
            bn_memory(api, b, {},
                      {{"resultSaveMean", d.save_mean}, {"resultSaveInvVariance", d.save_inv_var}});
    return st;
}

// Channel c of the forward: y normalised with the batch statistics (plus z, through the ReLU
// whose mask goes to the reserve space), blended; then the running and saved statistics.
void fwd_channel(const bn_shape &b, const fwd_math &m, const fwd_data &d, int c) {
    double mean, var;
    bn_stats(b, d.x, c, &mean, &var);
    double inv = 1.0 / std::sqrt(var + m.eps), g = load(d.scale, b.pdt, c),
           sh = load(d.bias, b.pdt, c);
    char *rs = d.reserve;
    if (m.stats_reserve) {
        reinterpret_cast<double *>(rs)[2 * c] = mean;
        reinterpret_cast<double *>(rs)[2 * c + 1] = inv;
    }
    for (int n = 0; n < b.n; n++)
        for (int h = 0; h < b.h; h++)
            for (int w = 0; w < b.w; w++) {
                int64_t i = bn_at(b, n, c, h, w), l = logical(b, n, c, h, w);
                double v = (load(d.x, b.dt, i) - mean) * inv * g + sh;
                if (d.z) v += load(d.z, b.dt, i);
                if (m.act) {
                    bool keep = !(v <= 0); // a NaN's gradient passes, as torch's relu's
                    if (!keep && !(m.nan && std::isnan(v))) v = 0;
                    uint8_t bit = static_cast<uint8_t>(1u << (l % 8));
                    rs[l / 8] = static_cast<char>(keep ? rs[l / 8] | bit : rs[l / 8] & ~bit);
                }
                v *= m.alpha;
                if (m.beta != 0) v += m.beta * load(d.y, b.dt, i);
                store(d.y, b.dt, i, v);
            }
    int64_t cnt = (int64_t)b.n * b.h * b.w;
    double f = m.factor;
    if (d.running_mean) { // the unbiased variance into the running estimate
        store(d.running_mean, b.pdt, c, (1 - f) * load(d.running_mean, b.pdt, c) + f * mean);
        store(d.running_var, b.pdt, c,
              (1 - f) * load(d.running_var, b.pdt, c) + f * var * cnt / (double)(cnt - 1));
    }
    if (d.save_mean) {
        store(d.save_mean, b.pdt, c, mean);
        store(d.save_inv_var, b.pdt, c, inv);
    }
}

// The training forward: the Ex call, or the plain one (ex false: bnOps BN and no z, activation,
// workspace or reserve space).
cudnnStatus_t forward_training(
    const char *api, bool ex, cudnnHandle_t handle, cudnnBatchNormMode_t mode,
    cudnnBatchNormOps_t bnOps, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *xData, const cudnnTensorDescriptor_t zDesc,
    const void *zData, const cudnnTensorDescriptor_t yDesc, void *yData,
    const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale, const void *bnBias,
    double exponentialAverageFactor, void *resultRunningMean, void *resultRunningVariance,
    double epsilon, void *resultSaveMean, void *resultSaveInvVariance,
    cudnnActivationDescriptor_t activationDesc, void *workspace, size_t workSpaceSizeInBytes,
    void *reserveSpace, size_t reserveSpaceSizeInBytes) {
    bn_shape b;
    cudnnStatus_t st = bn_check(api, handle, mode, xDesc, yDesc, bnScaleBiasMeanVarDesc, epsilon,
                                {alpha, beta}, &b);
    if (st == CUDNN_STATUS_SUCCESS)
        st = ex_check(api, mode, bnOps, xDesc, zDesc, zData != nullptr, activationDesc);
    const fwd_data d = {bytes(xData),
                        bytes(zData),
                        bytes(bnScale),
                        bytes(bnBias),
                        bytes(yData),
                        bytes(resultRunningMean),
                        bytes(resultRunningVariance),
                        bytes(resultSaveMean),
                        bytes(resultSaveInvVariance),
                        bytes(reserveSpace)};
    if (st == CUDNN_STATUS_SUCCESS) st = fwd_check_data(api, b, d);
    if (st == CUDNN_STATUS_SUCCESS)
        st = spaces(api, ex, workspace, workSpaceSizeInBytes, fwd_workspace(xDesc), mode, bnOps,
                    xDesc, reserveSpace, reserveSpaceSizeInBytes);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    bool f64 = b.dt == CUDNN_DATA_DOUBLE, act = bnOps != CUDNN_BATCHNORM_OPS_BN;
    const fwd_math m = {scalar(alpha, f64),
                        scalar(beta, f64),
                        exponentialAverageFactor,
                        epsilon,
                        act,
                        act && activationDesc->nan == CUDNN_PROPAGATE_NAN,
                        stats_in_reserve(ex, mode, bnOps)};
    mtemu::enqueue(handle->stream, [=] {
        for (int c = 0; c < b.c; c++) fwd_channel(b, m, d, c);
    });
    return CUDNN_STATUS_SUCCESS;
}

// ---- the training backward

// A training backward's data, by value: the inputs (y and the bias only with an activation;
// the saved statistics optional but in persistent mode), the reserve space the forward left,
// and the outputs (dz only for BN_ADD_ACTIVATION).
struct bwd_data {
    const char *x, *y, *dy, *scale, *bias, *saved_mean, *saved_inv_var, *reserve;
    char *dz, *dx, *dscale, *dbias;
};
// Its scalars: the blend factors of the data and parameter gradients, epsilon, whether dy
// goes through the forward's ReLU mask, and whether the statistics come from the reserve space.
struct bwd_math {
    double alpha_data, beta_data, alpha_param, beta_param, eps;
    bool act, stats_reserve;
};

// The backward's pointers: the saved statistics given as a pair (and given in persistent
// mode), each pointer device memory of its size.
cudnnStatus_t bwd_check_data(const char *api, const bn_shape &b, cudnnBatchNormMode_t mode,
                             bool act, const bwd_data &d) {
    cudnnStatus_t st =
        both_or_none(api, d.saved_mean, d.saved_inv_var, "saved mean and inverse variance");
    if (st == CUDNN_STATUS_SUCCESS && !d.saved_mean && mode == CUDNN_BATCHNORM_SPATIAL_PERSISTENT)
        return fail(CUDNN_STATUS_BAD_PARAM,
                    "%s: SPATIAL_PERSISTENT mode needs the saved mean and inverse variance", api);
    if (st == CUDNN_STATUS_SUCCESS)
        st = bn_memory(
            api, b, {{"x", d.x}, {"dy", d.dy}, {"dx", d.dx}},
            {{"bnScale", d.scale}, {"dBnScaleResult", d.dscale}, {"dBnBiasResult", d.dbias}});
    if (st == CUDNN_STATUS_SUCCESS && act) // y and the bias: needed with an activation
        st = bn_memory(api, b, {{"y", d.y}}, {{"bnBias", d.bias}});
    if (st == CUDNN_STATUS_SUCCESS && !act && d.y) st = bn_memory(api, b, {{"y", d.y}}, {});
    if (st == CUDNN_STATUS_SUCCESS && !act && d.bias)
        st = bn_memory(api, b, {}, {{"bnBias", d.bias}});
    if (st == CUDNN_STATUS_SUCCESS && d.dz) st = bn_memory(api, b, {{"dz", d.dz}}, {});
    if (st == CUDNN_STATUS_SUCCESS && d.saved_mean)
        st = bn_memory(api, b, {},
                       {{"savedMean", d.saved_mean}, {"savedInvVariance", d.saved_inv_var}});
    return st;
}

// dy at (n, c, h, w) through the ReLU mask the forward left in the reserve space.
double bwd_grad(const bn_shape &b, const bwd_math &m, const bwd_data &d, int n, int c, int h,
                int w) {
    double g = load(d.dy, b.dt, bn_at(b, n, c, h, w));
    return m.act && !mask_bit(d.reserve, logical(b, n, c, h, w)) ? 0.0 : g;
}

// Channel c of the backward: the statistics (the forward's in the reserve space, saved, or
// computed again), the sums of dy and dy * x_hat, then dx (and dz), and the parameter
// gradients, each blended.
void bwd_channel(const bn_shape &b, const bwd_math &m, const bwd_data &d, int c) {
    int64_t cnt = (int64_t)b.n * b.h * b.w;
    double mean, inv;
    if (m.stats_reserve) {
        mean = reinterpret_cast<const double *>(d.reserve)[2 * c];
        inv = reinterpret_cast<const double *>(d.reserve)[2 * c + 1];
    } else if (d.saved_mean) {
        mean = load(d.saved_mean, b.pdt, c);
        inv = load(d.saved_inv_var, b.pdt, c);
    } else {
        double var;
        bn_stats(b, d.x, c, &mean, &var);
        inv = 1.0 / std::sqrt(var + m.eps);
    }
    double sg = 0, sgx = 0;
    for (int n = 0; n < b.n; n++)
        for (int h = 0; h < b.h; h++)
            for (int w = 0; w < b.w; w++) {
                double g = bwd_grad(b, m, d, n, c, h, w);
                sg += g;
                sgx += g * (load(d.x, b.dt, bn_at(b, n, c, h, w)) - mean) * inv;
            }
    double gamma = load(d.scale, b.pdt, c), ad = m.alpha_data, bd = m.beta_data;
    for (int n = 0; n < b.n; n++)
        for (int h = 0; h < b.h; h++)
            for (int w = 0; w < b.w; w++) {
                int64_t i = bn_at(b, n, c, h, w);
                double g = bwd_grad(b, m, d, n, c, h, w), xh = (load(d.x, b.dt, i) - mean) * inv;
                double v = ad * gamma * inv * (g - sg / cnt - xh * sgx / cnt);
                if (bd != 0) v += bd * load(d.dx, b.dt, i);
                store(d.dx, b.dt, i, v);
                if (d.dz)
                    store(d.dz, b.dt, i, bd != 0 ? ad * g + bd * load(d.dz, b.dt, i) : ad * g);
            }
    double gw = m.alpha_param * sgx, gb = m.alpha_param * sg;
    if (m.beta_param != 0) {
        gw += m.beta_param * load(d.dscale, b.pdt, c);
        gb += m.beta_param * load(d.dbias, b.pdt, c);
    }
    store(d.dscale, b.pdt, c, gw);
    store(d.dbias, b.pdt, c, gb);
}

// The training backward: the Ex call, or the plain one (ex false: bnOps BN and no y, dz,
// activation, workspace or reserve space).
cudnnStatus_t
backward(const char *api, bool ex, cudnnHandle_t handle, cudnnBatchNormMode_t mode,
         cudnnBatchNormOps_t bnOps, const void *alphaDataDiff, const void *betaDataDiff,
         const void *alphaParamDiff, const void *betaParamDiff, const cudnnTensorDescriptor_t xDesc,
         const void *xData, const cudnnTensorDescriptor_t yDesc, const void *yData,
         const cudnnTensorDescriptor_t dyDesc, const void *dyData,
         const cudnnTensorDescriptor_t dzDesc, void *dzData, const cudnnTensorDescriptor_t dxDesc,
         void *dxData, const cudnnTensorDescriptor_t dBnScaleBiasDesc, const void *bnScaleData,
         const void *bnBiasData, void *dBnScaleData, void *dBnBiasData, double epsilon,
         const void *savedMean, const void *savedInvVariance,
         cudnnActivationDescriptor_t activationDesc, void *workSpace, size_t workSpaceSizeInBytes,
         void *reserveSpace, size_t reserveSpaceSizeInBytes) {
    bn_shape b;
    bool act = bnOps != CUDNN_BATCHNORM_OPS_BN;
    cudnnStatus_t st = bn_check(api, handle, mode, xDesc, dyDesc, dBnScaleBiasDesc, epsilon,
                                {alphaDataDiff, betaDataDiff, alphaParamDiff, betaParamDiff}, &b);
    if (st == CUDNN_STATUS_SUCCESS)
        st = ex_check(api, mode, bnOps, xDesc, dzDesc, dzData != nullptr, activationDesc);
    if (st == CUDNN_STATUS_SUCCESS) st = bwd_descs(api, act, xDesc, yDesc, dxDesc);
    const bwd_data d = {
        bytes(xData),      bytes(yData),     bytes(dyData),           bytes(bnScaleData),
        bytes(bnBiasData), bytes(savedMean), bytes(savedInvVariance), bytes(reserveSpace),
        bytes(dzData),     bytes(dxData),    bytes(dBnScaleData),     bytes(dBnBiasData)};
    if (st == CUDNN_STATUS_SUCCESS) st = bwd_check_data(api, b, mode, act, d);
    if (st == CUDNN_STATUS_SUCCESS)
        st = spaces(api, ex, workSpace, workSpaceSizeInBytes, bwd_workspace(xDesc), mode, bnOps,
                    xDesc, reserveSpace, reserveSpaceSizeInBytes);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    bool f64 = b.dt == CUDNN_DATA_DOUBLE;
    const bwd_math m = {scalar(alphaDataDiff, f64),
                        scalar(betaDataDiff, f64),
                        scalar(alphaParamDiff, f64),
                        scalar(betaParamDiff, f64),
                        epsilon,
                        act,
                        stats_in_reserve(ex, mode, bnOps)};
    mtemu::enqueue(handle->stream, [=] {
        for (int c = 0; c < b.c; c++) bwd_channel(b, m, d, c);
    });
    return CUDNN_STATUS_SUCCESS;
}

} // namespace

extern "C" {

cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t *d) {
    return make("cudnnCreateActivationDescriptor", d);
}
cudnnStatus_t cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t d) {
    return destroy("cudnnDestroyActivationDescriptor", d);
}

cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t d,
                                           cudnnActivationMode_t mode,
                                           cudnnNanPropagation_t reluNanOpt, double coef) {
    const char *api = "cudnnSetActivationDescriptor";
    if (!is_live(d))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: descriptor %p is not live", api, (void *)d);
    if (mode < CUDNN_ACTIVATION_SIGMOID || mode > CUDNN_ACTIVATION_SWISH)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: mode %d", api, mode);
    if (reluNanOpt != CUDNN_PROPAGATE_NAN && reluNanOpt != CUDNN_NOT_PROPAGATE_NAN)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: NaN option %d", api, reluNanOpt);
    d->mode = mode;
    d->nan = reluNanOpt;
    d->coef = coef;
    d->set = true;
    return CUDNN_STATUS_SUCCESS;
}

// ---- the training forward and backward

cudnnStatus_t cudnnBatchNormalizationForwardTraining(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t yDesc,
    void *y, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale,
    const void *bnBias, double exponentialAverageFactor, void *resultRunningMean,
    void *resultRunningVariance, double epsilon, void *resultSaveMean,
    void *resultSaveInvVariance) {
    return forward_training("cudnnBatchNormalizationForwardTraining", false, handle, mode,
                            CUDNN_BATCHNORM_OPS_BN, alpha, beta, xDesc, x, nullptr, nullptr, yDesc,
                            y, bnScaleBiasMeanVarDesc, bnScale, bnBias, exponentialAverageFactor,
                            resultRunningMean, resultRunningVariance, epsilon, resultSaveMean,
                            resultSaveInvVariance, nullptr, nullptr, 0, nullptr, 0);
}

cudnnStatus_t cudnnBatchNormalizationForwardTrainingEx(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps, const void *alpha,
    const void *beta, const cudnnTensorDescriptor_t xDesc, const void *xData,
    const cudnnTensorDescriptor_t zDesc, const void *zData, const cudnnTensorDescriptor_t yDesc,
    void *yData, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale,
    const void *bnBias, double exponentialAverageFactor, void *resultRunningMean,
    void *resultRunningVariance, double epsilon, void *resultSaveMean, void *resultSaveInvVariance,
    cudnnActivationDescriptor_t activationDesc, void *workspace, size_t workSpaceSizeInBytes,
    void *reserveSpace, size_t reserveSpaceSizeInBytes) {
    return forward_training("cudnnBatchNormalizationForwardTrainingEx", true, handle, mode, bnOps,
                            alpha, beta, xDesc, xData, zDesc, zData, yDesc, yData,
                            bnScaleBiasMeanVarDesc, bnScale, bnBias, exponentialAverageFactor,
                            resultRunningMean, resultRunningVariance, epsilon, resultSaveMean,
                            resultSaveInvVariance, activationDesc, workspace, workSpaceSizeInBytes,
                            reserveSpace, reserveSpaceSizeInBytes);
}

cudnnStatus_t cudnnBatchNormalizationBackward(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alphaDataDiff,
    const void *betaDataDiff, const void *alphaParamDiff, const void *betaParamDiff,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t dyDesc,
    const void *dy, const cudnnTensorDescriptor_t dxDesc, void *dx,
    const cudnnTensorDescriptor_t dBnScaleBiasDesc, const void *bnScale, void *dBnScaleResult,
    void *dBnBiasResult, double epsilon, const void *savedMean, const void *savedInvVariance) {
    return backward("cudnnBatchNormalizationBackward", false, handle, mode, CUDNN_BATCHNORM_OPS_BN,
                    alphaDataDiff, betaDataDiff, alphaParamDiff, betaParamDiff, xDesc, x, nullptr,
                    nullptr, dyDesc, dy, nullptr, nullptr, dxDesc, dx, dBnScaleBiasDesc, bnScale,
                    nullptr, dBnScaleResult, dBnBiasResult, epsilon, savedMean, savedInvVariance,
                    nullptr, nullptr, 0, nullptr, 0);
}

cudnnStatus_t cudnnBatchNormalizationBackwardEx(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps,
    const void *alphaDataDiff, const void *betaDataDiff, const void *alphaParamDiff,
    const void *betaParamDiff, const cudnnTensorDescriptor_t xDesc, const void *xData,
    const cudnnTensorDescriptor_t yDesc, const void *yData, const cudnnTensorDescriptor_t dyDesc,
    const void *dyData, const cudnnTensorDescriptor_t dzDesc, void *dzData,
    const cudnnTensorDescriptor_t dxDesc, void *dxData,
    const cudnnTensorDescriptor_t dBnScaleBiasDesc, const void *bnScaleData, const void *bnBiasData,
    void *dBnScaleData, void *dBnBiasData, double epsilon, const void *savedMean,
    const void *savedInvVariance, cudnnActivationDescriptor_t activationDesc, void *workSpace,
    size_t workSpaceSizeInBytes, void *reserveSpace, size_t reserveSpaceSizeInBytes) {
    return backward("cudnnBatchNormalizationBackwardEx", true, handle, mode, bnOps, alphaDataDiff,
                    betaDataDiff, alphaParamDiff, betaParamDiff, xDesc, xData, yDesc, yData, dyDesc,
                    dyData, dzDesc, dzData, dxDesc, dxData, dBnScaleBiasDesc, bnScaleData,
                    bnBiasData, dBnScaleData, dBnBiasData, epsilon, savedMean, savedInvVariance,
                    activationDesc, workSpace, workSpaceSizeInBytes, reserveSpace,
                    reserveSpaceSizeInBytes);
}

// ---- the Ex size queries

cudnnStatus_t cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps,
    const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t zDesc,
    const cudnnTensorDescriptor_t yDesc, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc,
    const cudnnActivationDescriptor_t activationDesc, size_t *sizeInBytes) {
    const char *api = "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize";
    bn_shape b;
    cudnnStatus_t st =
        bn_check(api, handle, mode, xDesc, yDesc, bnScaleBiasMeanVarDesc, 0.0, {}, &b);
    if (st == CUDNN_STATUS_SUCCESS)
        st = ex_check(api, mode, bnOps, xDesc, zDesc, zDesc != nullptr, activationDesc);
    return st != CUDNN_STATUS_SUCCESS ? st : answer(api, sizeInBytes, fwd_workspace(xDesc));
}

cudnnStatus_t cudnnGetBatchNormalizationBackwardExWorkspaceSize(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps,
    const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t yDesc,
    const cudnnTensorDescriptor_t dyDesc, const cudnnTensorDescriptor_t dzDesc,
    const cudnnTensorDescriptor_t dxDesc, const cudnnTensorDescriptor_t dBnScaleBiasDesc,
    const cudnnActivationDescriptor_t activationDesc, size_t *sizeInBytes) {
    const char *api = "cudnnGetBatchNormalizationBackwardExWorkspaceSize";
    bn_shape b;
    cudnnStatus_t st = bn_check(api, handle, mode, xDesc, dyDesc, dBnScaleBiasDesc, 0.0, {}, &b);
    if (st == CUDNN_STATUS_SUCCESS)
        st = ex_check(api, mode, bnOps, xDesc, dzDesc, dzDesc != nullptr, activationDesc);
    if (st == CUDNN_STATUS_SUCCESS)
        st = bwd_descs(api, bnOps != CUDNN_BATCHNORM_OPS_BN, xDesc, yDesc, dxDesc);
    return st != CUDNN_STATUS_SUCCESS ? st : answer(api, sizeInBytes, bwd_workspace(xDesc));
}

cudnnStatus_t cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps,
    const cudnnActivationDescriptor_t activationDesc, const cudnnTensorDescriptor_t xDesc,
    size_t *sizeInBytes) {
    const char *api = "cudnnGetBatchNormalizationTrainingExReserveSpaceSize";
    cudnnStatus_t st = check_handle(api, handle);
    if (st == CUDNN_STATUS_SUCCESS) st = injected(api);
    if (st == CUDNN_STATUS_SUCCESS) st = check_tensor(api, "x", xDesc);
    bool add = bnOps == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION; // z is not part of this query
    if (st == CUDNN_STATUS_SUCCESS)
        st = ex_check(api, mode, bnOps, xDesc, add ? xDesc : nullptr, add, activationDesc);
    return st != CUDNN_STATUS_SUCCESS
               ? st
               : answer(api, sizeInBytes, reserve_size(true, mode, bnOps, xDesc));
}

// y = scale (x - mean) / sqrt(var + eps) + bias with the given (running) statistics
cudnnStatus_t cudnnBatchNormalizationForwardInference(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t yDesc,
    void *y, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale,
    const void *bnBias, const void *estimatedMean, const void *estimatedVariance, double epsilon) {
    const char *api = "cudnnBatchNormalizationForwardInference";
    bn_shape b;
    cudnnStatus_t st = bn_check(api, handle, mode, xDesc, yDesc, bnScaleBiasMeanVarDesc, epsilon,
                                {alpha, beta}, &b);
    if (st == CUDNN_STATUS_SUCCESS)
        st = bn_memory(api, b, {{"x", x}, {"y", y}},
                       {{"bnScale", bnScale},
                        {"bnBias", bnBias},
                        {"estimatedMean", estimatedMean},
                        {"estimatedVariance", estimatedVariance}});
    if (st != CUDNN_STATUS_SUCCESS) return st;
    bool f64 = b.dt == CUDNN_DATA_DOUBLE;
    double al = scalar(alpha, f64), be = scalar(beta, f64), eps = epsilon;
    const char *xp = static_cast<const char *>(x), *wp = static_cast<const char *>(bnScale),
               *bp = static_cast<const char *>(bnBias),
               *mp = static_cast<const char *>(estimatedMean),
               *vp = static_cast<const char *>(estimatedVariance);
    char *yp = static_cast<char *>(y);
    mtemu::enqueue(handle->stream, [=] {
        for (int c = 0; c < b.c; c++) {
            double mean = load(mp, b.pdt, c), inv = 1.0 / std::sqrt(load(vp, b.pdt, c) + eps);
            double g = load(wp, b.pdt, c), sh = load(bp, b.pdt, c);
            for (int n = 0; n < b.n; n++)
                for (int h = 0; h < b.h; h++)
                    for (int w = 0; w < b.w; w++) {
                        int64_t i = bn_at(b, n, c, h, w);
                        double v = al * ((load(xp, b.dt, i) - mean) * inv * g + sh);
                        if (be != 0) v += be * load(yp, b.dt, i);
                        store(yp, b.dt, i, v);
                    }
        }
    });
    return CUDNN_STATUS_SUCCESS;
}

} // extern "C"
