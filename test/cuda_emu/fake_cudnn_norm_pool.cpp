// The fake cuDNN's pooling forward and batch norm in training (see fake_cudnn.cpp for the
// rules); the fused Ex batch norm and the inference are in fake_cudnn_bn_ex.cpp.
#include "fake_cudnn_internal.h"

#include <initializer_list>
#include <utility>

using namespace fakednn;

// ---- batch norm in training, spatial mode: per channel over N, H and W, in double

namespace fakednn {

int64_t bn_at(const bn_shape &b, int n, int c, int h, int w) {
    return (int64_t)n * b.xs[0] + (int64_t)c * b.xs[1] + (int64_t)h * b.xs[2] +
           (int64_t)w * b.xs[3];
}

// x (and y, dy, dx: the same descriptor contents), the parameter descriptor 1 x C x 1 x 1 of
// float (double for DOUBLE x), the mode, epsilon and the blend factors' pointers.
cudnnStatus_t bn_check(const char *api, cudnnHandle_t h, cudnnBatchNormMode_t mode,
                       cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t y,
                       cudnnTensorDescriptor_t p, double eps, const void *const *scalars,
                       int nscalars, bn_shape *b) {
    if (!is_live(h))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: handle %p is not live", api, (void *)h);
    cudnnStatus_t st = injected(api);
    if (st == CUDNN_STATUS_SUCCESS) st = check_tensor(api, "x", x);
    if (st == CUDNN_STATUS_SUCCESS) st = check_tensor(api, "y", y);
    if (st == CUDNN_STATUS_SUCCESS) st = check_tensor(api, "bnScaleBiasMeanVar", p);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (mode != CUDNN_BATCHNORM_SPATIAL && mode != CUDNN_BATCHNORM_SPATIAL_PERSISTENT)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "%s: mode %d is not emulated", api, mode);
    if (x->nd != 4 || y->nd != 4 || p->nd != 4)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "%s: only 4-d batch norm is emulated", api);
    if (x->dt != y->dt || std::memcmp(x->dims, y->dims, sizeof x->dims) != 0 ||
        std::memcmp(x->strides, y->strides, sizeof x->strides) != 0)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: x and y (dx, dy) descriptors differ", api);
    if (x->dt == CUDNN_DATA_BFLOAT16)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "%s: BFLOAT16 batch norm is not emulated", api);
    cudnnDataType_t want = x->dt == CUDNN_DATA_DOUBLE ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    if (p->dt != want || p->dims[0] != 1 || p->dims[1] != x->dims[1] || p->dims[2] != 1 ||
        p->dims[3] != 1)
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
    for (int i = 0; i < nscalars; i++)
        if (!scalars[i] || mtemu::device_range(scalars[i], 1))
            return fail(CUDNN_STATUS_BAD_PARAM, "%s: the blend factors must be host pointers", api);
    b->dt = x->dt;
    b->pdt = want;
    b->n = x->dims[0];
    b->c = x->dims[1];
    b->h = x->dims[2];
    b->w = x->dims[3];
    for (int i = 0; i < 4; i++) b->xs[i] = x->strides[i];
    return CUDNN_STATUS_SUCCESS;
}

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

// The mean and 1/sqrt(biased var + eps) of channel c, or the saved ones.
void bn_stats(const bn_shape &b, const char *x, int c, double eps, double *mean, double *var) {
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
    (void)eps;
}

void bn_store_channel_stats(const bn_shape &b, int c, double mean, double var, double inv, double f,
                            char *rm, char *rv, char *sm, char *si) {
    int64_t m = (int64_t)b.n * b.h * b.w;
    if (rm) { // the unbiased variance into the running estimate
        store(rm, b.pdt, c, (1 - f) * load(rm, b.pdt, c) + f * mean);
        store(rv, b.pdt, c, (1 - f) * load(rv, b.pdt, c) + f * var * m / (double)(m - 1));
    }
    if (sm) {
        store(sm, b.pdt, c, mean);
        store(si, b.pdt, c, inv);
    }
}

} // namespace fakednn

extern "C" {

cudnnStatus_t cudnnBatchNormalizationForwardTraining(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t yDesc,
    void *y, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale,
    const void *bnBias, double exponentialAverageFactor, void *resultRunningMean,
    void *resultRunningVariance, double epsilon, void *resultSaveMean,
    void *resultSaveInvVariance) {
    const char *api = "cudnnBatchNormalizationForwardTraining";
    bn_shape b;
    const void *sc[2] = {alpha, beta};
    cudnnStatus_t st =
        bn_check(api, handle, mode, xDesc, yDesc, bnScaleBiasMeanVarDesc, epsilon, sc, 2, &b);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (!resultRunningMean != !resultRunningVariance || !resultSaveMean != !resultSaveInvVariance)
        return fail(CUDNN_STATUS_BAD_PARAM,
                    "%s: running (or saved) mean and variance must both be given or both NULL",
                    api);
    st = bn_memory(api, b, {{"x", x}, {"y", y}}, {{"bnScale", bnScale}, {"bnBias", bnBias}});
    if (st == CUDNN_STATUS_SUCCESS && resultRunningMean)
        st = bn_memory(api, b, {},
                       {{"resultRunningMean", resultRunningMean},
                        {"resultRunningVariance", resultRunningVariance}});
    if (st == CUDNN_STATUS_SUCCESS && resultSaveMean)
        st = bn_memory(
            api, b, {},
            {{"resultSaveMean", resultSaveMean}, {"resultSaveInvVariance", resultSaveInvVariance}});
    if (st != CUDNN_STATUS_SUCCESS) return st;
    bool f64 = b.dt == CUDNN_DATA_DOUBLE;
    double al = scalar(alpha, f64), be = scalar(beta, f64), f = exponentialAverageFactor,
           eps = epsilon;
    const char *xp = static_cast<const char *>(x), *wp = static_cast<const char *>(bnScale),
               *bp = static_cast<const char *>(bnBias);
    char *yp = static_cast<char *>(y), *rm = static_cast<char *>(resultRunningMean),
         *rv = static_cast<char *>(resultRunningVariance),
         *sm = static_cast<char *>(resultSaveMean),
         *si = static_cast<char *>(resultSaveInvVariance);
    mtemu::enqueue(handle->stream, [=] {
        for (int c = 0; c < b.c; c++) {
            double mean, var;
            bn_stats(b, xp, c, eps, &mean, &var);
            double inv = 1.0 / std::sqrt(var + eps), g = load(wp, b.pdt, c),
                   sh = load(bp, b.pdt, c);
            for (int n = 0; n < b.n; n++)
                for (int h = 0; h < b.h; h++)
                    for (int w = 0; w < b.w; w++) {
                        int64_t i = bn_at(b, n, c, h, w);
                        double v = al * ((load(xp, b.dt, i) - mean) * inv * g + sh);
                        if (be != 0) v += be * load(yp, b.dt, i);
                        store(yp, b.dt, i, v);
                    }
            bn_store_channel_stats(b, c, mean, var, inv, f, rm, rv, sm, si);
        }
    });
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBatchNormalizationBackward(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alphaDataDiff,
    const void *betaDataDiff, const void *alphaParamDiff, const void *betaParamDiff,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t dyDesc,
    const void *dy, const cudnnTensorDescriptor_t dxDesc, void *dx,
    const cudnnTensorDescriptor_t dBnScaleBiasDesc, const void *bnScale, void *dBnScaleResult,
    void *dBnBiasResult, double epsilon, const void *savedMean, const void *savedInvVariance) {
    const char *api = "cudnnBatchNormalizationBackward";
    bn_shape b;
    const void *sc[4] = {alphaDataDiff, betaDataDiff, alphaParamDiff, betaParamDiff};
    cudnnStatus_t st =
        bn_check(api, handle, mode, xDesc, dyDesc, dBnScaleBiasDesc, epsilon, sc, 4, &b);
    if (st == CUDNN_STATUS_SUCCESS) st = check_tensor(api, "dx", dxDesc);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (dxDesc->dt != b.dt || std::memcmp(dxDesc->dims, xDesc->dims, sizeof xDesc->dims) != 0 ||
        std::memcmp(dxDesc->strides, xDesc->strides, sizeof xDesc->strides) != 0)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: dx and x descriptors differ", api);
    if (!savedMean != !savedInvVariance)
        return fail(CUDNN_STATUS_BAD_PARAM,
                    "%s: saved mean and inverse variance must both be given or both NULL", api);
    st = bn_memory(api, b, {{"x", x}, {"dy", dy}, {"dx", dx}},
                   {{"bnScale", bnScale},
                    {"dBnScaleResult", dBnScaleResult},
                    {"dBnBiasResult", dBnBiasResult}});
    if (st == CUDNN_STATUS_SUCCESS && savedMean)
        st = bn_memory(api, b, {},
                       {{"savedMean", savedMean}, {"savedInvVariance", savedInvVariance}});
    if (st != CUDNN_STATUS_SUCCESS) return st;
    bool f64 = b.dt == CUDNN_DATA_DOUBLE;
    double ad = scalar(alphaDataDiff, f64), bd = scalar(betaDataDiff, f64),
           ap = scalar(alphaParamDiff, f64), bpd = scalar(betaParamDiff, f64), eps = epsilon;
    const char *xp = static_cast<const char *>(x), *gyp = static_cast<const char *>(dy),
               *wp = static_cast<const char *>(bnScale),
               *smp = static_cast<const char *>(savedMean),
               *sip = static_cast<const char *>(savedInvVariance);
    char *gxp = static_cast<char *>(dx), *gwp = static_cast<char *>(dBnScaleResult),
         *gbp = static_cast<char *>(dBnBiasResult);
    mtemu::enqueue(handle->stream, [=] {
        int64_t m = (int64_t)b.n * b.h * b.w;
        for (int c = 0; c < b.c; c++) {
            double mean, inv;
            if (smp) {
                mean = load(smp, b.pdt, c);
                inv = load(sip, b.pdt, c);
            } else {
                double var;
                bn_stats(b, xp, c, eps, &mean, &var);
                inv = 1.0 / std::sqrt(var + eps);
            }
            double sg = 0, sgx = 0; // sum(dy), sum(dy * xhat)
            for (int n = 0; n < b.n; n++)
                for (int h = 0; h < b.h; h++)
                    for (int w = 0; w < b.w; w++) {
                        int64_t i = bn_at(b, n, c, h, w);
                        double g = load(gyp, b.dt, i);
                        sg += g;
                        sgx += g * (load(xp, b.dt, i) - mean) * inv;
                    }
            double gamma = load(wp, b.pdt, c);
            for (int n = 0; n < b.n; n++)
                for (int h = 0; h < b.h; h++)
                    for (int w = 0; w < b.w; w++) {
                        int64_t i = bn_at(b, n, c, h, w);
                        double xh = (load(xp, b.dt, i) - mean) * inv;
                        double v = ad * gamma * inv * (load(gyp, b.dt, i) - sg / m - xh * sgx / m);
                        if (bd != 0) v += bd * load(gxp, b.dt, i);
                        store(gxp, b.dt, i, v);
                    }
            double gw = ap * sgx, gb = ap * sg;
            if (bpd != 0) {
                gw += bpd * load(gwp, b.pdt, c);
                gb += bpd * load(gbp, b.pdt, c);
            }
            store(gwp, b.pdt, c, gw);
            store(gbp, b.pdt, c, gb);
        }
    });
    return CUDNN_STATUS_SUCCESS;
}

// ---- pooling (forward only: mixtape's backward is its own kernel)

cudnnStatus_t cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t *d) {
    return make("cudnnCreatePoolingDescriptor", d);
}
cudnnStatus_t cudnnDestroyPoolingDescriptor(cudnnPoolingDescriptor_t d) {
    return destroy("cudnnDestroyPoolingDescriptor", d);
}

cudnnStatus_t cudnnSetPooling2dDescriptor(cudnnPoolingDescriptor_t d, cudnnPoolingMode_t mode,
                                          cudnnNanPropagation_t maxpoolingNanOpt, int windowHeight,
                                          int windowWidth, int verticalPadding,
                                          int horizontalPadding, int verticalStride,
                                          int horizontalStride) {
    const char *api = "cudnnSetPooling2dDescriptor";
    if (!is_live(d))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: descriptor %p is not live", api, (void *)d);
    if (mode != CUDNN_POOLING_MAX && mode != CUDNN_POOLING_MAX_DETERMINISTIC &&
        mode != CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING &&
        mode != CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: mode %d", api, mode);
    if (maxpoolingNanOpt != CUDNN_PROPAGATE_NAN && maxpoolingNanOpt != CUDNN_NOT_PROPAGATE_NAN)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: NaN option %d", api, maxpoolingNanOpt);
    if (windowHeight <= 0 || windowWidth <= 0 || verticalStride <= 0 || horizontalStride <= 0 ||
        verticalPadding < 0 || horizontalPadding < 0)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: window %dx%d, padding %d,%d, stride %d,%d", api,
                    windowHeight, windowWidth, verticalPadding, horizontalPadding, verticalStride,
                    horizontalStride);
    d->mode = mode;
    d->nan = maxpoolingNanOpt;
    d->window[0] = windowHeight;
    d->window[1] = windowWidth;
    d->pad[0] = verticalPadding;
    d->pad[1] = horizontalPadding;
    d->stride[0] = verticalStride;
    d->stride[1] = horizontalStride;
    d->set = true;
    return CUDNN_STATUS_SUCCESS;
}

// cuDNN's pooling: the output size is its floor formula (checked); max pads with -inf (a NaN
// wins only with CUDNN_PROPAGATE_NAN); INCLUDE_PADDING divides by the whole window, EXCLUDE by
// its part inside the input. Any strides. Accumulation in float (double for DOUBLE).
cudnnStatus_t cudnnPoolingForward(cudnnHandle_t handle, const cudnnPoolingDescriptor_t poolingDesc,
                                  const void *alpha, const cudnnTensorDescriptor_t xDesc,
                                  const void *x, const void *beta,
                                  const cudnnTensorDescriptor_t yDesc, void *y) {
    const char *api = "cudnnPoolingForward";
    if (!is_live(handle))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: handle %p is not live", api, (void *)handle);
    cudnnStatus_t st = injected(api);
    if (st == CUDNN_STATUS_SUCCESS) st = check_tensor(api, "x", xDesc);
    if (st == CUDNN_STATUS_SUCCESS) st = check_tensor(api, "y", yDesc);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (!is_live(poolingDesc) || !poolingDesc->set)
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: pooling descriptor not live or not set", api);
    cudnnTensorStruct xt = *xDesc, yt = *yDesc;
    cudnnPoolingStruct pd = *poolingDesc;
    if (xt.nd != 4 || yt.nd != 4)
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "%s: only 4-d pooling is emulated", api);
    if (xt.dt != yt.dt) return fail(CUDNN_STATUS_BAD_PARAM, "%s: x and y data types differ", api);
    for (int i = 0; i < 2; i++) {
        int out = (xt.dims[2 + i] + 2 * pd.pad[i] - pd.window[i]) / pd.stride[i] + 1;
        if (pd.pad[i] >= pd.window[i] || out < 1 || yt.dims[2 + i] != out ||
            yt.dims[0] != xt.dims[0] || yt.dims[1] != xt.dims[1])
            return fail(
                CUDNN_STATUS_BAD_PARAM,
                "%s: y is [%d, %d, %d, %d] for x [%d, %d, %d, %d] (window %d, pad %d, stride %d)",
                api, yt.dims[0], yt.dims[1], yt.dims[2], yt.dims[3], xt.dims[0], xt.dims[1],
                xt.dims[2], xt.dims[3], pd.window[i], pd.pad[i], pd.stride[i]);
    }
    st = check_memory(api, "x", x, span_bytes(xt.dims, xt.strides, 4, xt.dt));
    if (st == CUDNN_STATUS_SUCCESS)
        st = check_memory(api, "y", y, span_bytes(yt.dims, yt.strides, 4, yt.dt));
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (!alpha || !beta || mtemu::device_range(alpha, 1) || mtemu::device_range(beta, 1))
        return fail(CUDNN_STATUS_BAD_PARAM, "%s: alpha and beta must be host pointers", api);
    bool f64 = xt.dt == CUDNN_DATA_DOUBLE;
    double al = scalar(alpha, f64), be = scalar(beta, f64);
    const char *xp = static_cast<const char *>(x);
    char *yp = static_cast<char *>(y);
    mtemu::enqueue(handle->stream, [xt, yt, pd, xp, yp, al, be, f64] {
        const int *xs = xt.strides, *ys = yt.strides;
        bool max = pd.mode == CUDNN_POOLING_MAX || pd.mode == CUDNN_POOLING_MAX_DETERMINISTIC;
        for (int n = 0; n < yt.dims[0]; n++)
            for (int c = 0; c < yt.dims[1]; c++)
                for (int oh = 0; oh < yt.dims[2]; oh++)
                    for (int ow = 0; ow < yt.dims[3]; ow++) {
                        double acc = max ? -INFINITY : 0.0;
                        int inside = 0;
                        for (int r = 0; r < pd.window[0]; r++)
                            for (int q = 0; q < pd.window[1]; q++) {
                                int ih = oh * pd.stride[0] - pd.pad[0] + r,
                                    iw = ow * pd.stride[1] - pd.pad[1] + q;
                                if (ih < 0 || ih >= xt.dims[2] || iw < 0 || iw >= xt.dims[3])
                                    continue;
                                inside++;
                                double v = load(xp, xt.dt,
                                                (int64_t)n * xs[0] + (int64_t)c * xs[1] +
                                                    (int64_t)ih * xs[2] + (int64_t)iw * xs[3]);
                                if (!f64) v = static_cast<float>(v);
                                if (max) {
                                    if (std::isnan(v)
                                            ? pd.nan == CUDNN_PROPAGATE_NAN && !std::isnan(acc)
                                            : v > acc)
                                        acc = v;
                                } else {
                                    acc = f64 ? acc + v : static_cast<float>(acc + v);
                                }
                            }
                        if (!max)
                            acc /= pd.mode == CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                       ? pd.window[0] * pd.window[1]
                                       : inside;
                        int64_t yi = (int64_t)n * ys[0] + (int64_t)c * ys[1] + (int64_t)oh * ys[2] +
                                     (int64_t)ow * ys[3];
                        double r = al * acc;
                        if (be != 0) r += be * load(yp, yt.dt, yi);
                        store(yp, yt.dt, yi, r);
                    }
    });
    return CUDNN_STATUS_SUCCESS;
}

} // extern "C"
