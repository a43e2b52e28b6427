// The fake cuDNN's pooling forward (see fake_cudnn.cpp for the rules).
#include "fake_cudnn_internal.h"

using namespace fakednn;

extern "C" {

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
    cudnnStatus_t st = check_live(api, d);
    if (st != CUDNN_STATUS_SUCCESS) return st;
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
    d->window = {windowHeight, windowWidth};
    d->pad = {verticalPadding, horizontalPadding};
    d->stride = {verticalStride, horizontalStride};
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
    cudnnStatus_t st;
    if ((st = check_handle(api, handle)) || (st = injected(api)) ||
        (st = check_tensor(api, "x", xDesc)) || (st = check_tensor(api, "y", yDesc)) ||
        (st = check_set(api, "pooling", poolingDesc)))
        return st;
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
    st = check_host_scalars(api, {alpha, beta}, CUDNN_STATUS_BAD_PARAM);
    if (st != CUDNN_STATUS_SUCCESS) return st;
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
