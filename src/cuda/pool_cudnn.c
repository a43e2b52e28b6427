/* Pooling forward through cuDNN where cuDNN's definition is torch's (mt_cudnn_pool_expressible);
   pool_cuda.c runs the own kernels of pool.cu for the rest (ceil_mode overhang, uneven
   adaptive windows) and for every backward (torch's first-maximum rule, and the family gets x,
   not the forward's output cuDNN's backward wants). Tensors are described with their own
   strides, so NCHW and channels-last alike. */
#include <limits.h>
#include "cudnn_impl.h"

/* The (kernel, stride, padding) cuDNN runs for p: adaptive pooling with windows that divide
   evenly is an average pooling with kernel = stride = H / OH. */
static void geometry(const mt_tensor *x, const mt_tensor *y, const mt_pool2d_params *p, int64_t *k,
                     int64_t *s, int64_t *pad) {
    for (int i = 0; i < 2; i++) {
        if (p->kind == MT_POOL_ADAPTIVE_AVG) {
            k[i] = s[i] = x->shape[2 + i] / y->shape[2 + i];
            pad[i] = 0;
        } else {
            k[i] = p->kernel[i];
            s[i] = p->stride[i];
            pad[i] = p->padding[i];
        }
    }
}

static bool fits_int(const mt_tensor *t) {
    for (int i = 0; i < 4; i++)
        if (t->shape[i] > INT_MAX || t->strides[i] > INT_MAX || t->strides[i] < 1) return false;
    return true;
}

bool mt_cudnn_pool_expressible(const mt_tensor *x, const mt_tensor *y, const mt_pool2d_params *p) {
    if (x->numel == 0 || y->numel == 0 || !fits_int(x) || !fits_int(y)) return false;
    int64_t k[2], s[2], pad[2];
    geometry(x, y, p, k, s, pad);
    for (int i = 0; i < 2; i++) {
        if (p->kind == MT_POOL_ADAPTIVE_AVG && x->shape[2 + i] % y->shape[2 + i]) return false;
        if (k[i] > INT_MAX || s[i] > INT_MAX || pad[i] > INT_MAX) return false;
        /* no ceil_mode overhang, not even a window larger than the padded input (C's
           division would round that -1 / s up to the same count) */
        if (x->shape[2 + i] + 2 * pad[i] < k[i] ||
            (x->shape[2 + i] + 2 * pad[i] - k[i]) / s[i] + 1 != y->shape[2 + i])
            return false;
    }
    return mt_cudnn_available();
}

static cudnnDataType_t dnn_dtype(mt_dtype dt) {
    return dt == MT_F64    ? CUDNN_DATA_DOUBLE
           : dt == MT_F16  ? CUDNN_DATA_HALF
           : dt == MT_BF16 ? CUDNN_DATA_BFLOAT16
                           : CUDNN_DATA_FLOAT;
}

static int describe(const char *op, const mt_cudnn_api *api, cudnnTensorDescriptor_t d,
                    const mt_tensor *t) {
    int dims[4], strides[4];
    for (int i = 0; i < 4; i++) {
        dims[i] = (int)t->shape[i];
        strides[i] = (int)t->strides[i];
    }
    return mt_cudnn_check(op, "cudnnSetTensorNdDescriptor",
                          api->set_tensor_nd(d, dnn_dtype(t->dtype), 4, dims, strides));
}

int mt_cudnn_pool2d(const char *op, mt_tensor *y, const mt_tensor *x, const mt_pool2d_params *p) {
    mt_cuda_device_ctx *c = mt_cuda_ctx_get(op, y->device.index);
    cudnnHandle_t h = c ? mt_cudnn_handle(op, c) : NULL;
    if (!h) return mt_last_status();
    const mt_cudnn_api *api = mt_cudnn_load(op, c->device);
    int64_t k[2], s[2], pad[2];
    geometry(x, y, p, k, s, pad);
    cudnnPoolingMode_t mode = p->kind == MT_POOL_MAX ? CUDNN_POOLING_MAX
                              : p->kind == MT_POOL_AVG && p->count_include_pad
                                  ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                  : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
    cudnnPoolingDescriptor_t pd = NULL;
    cudnnTensorDescriptor_t xd = NULL, yd = NULL;
    int rc = mt_cudnn_check(op, "cudnnCreatePoolingDescriptor", api->create_pool(&pd));
    if (!rc) rc = mt_cudnn_check(op, "cudnnCreateTensorDescriptor", api->create_tensor(&xd));
    if (!rc) rc = mt_cudnn_check(op, "cudnnCreateTensorDescriptor", api->create_tensor(&yd));
    if (!rc) rc = describe(op, api, xd, x);
    if (!rc) rc = describe(op, api, yd, y);
    /* NaN propagates, as torch's max (a NaN in the window is the maximum) */
    if (!rc)
        rc = mt_cudnn_check(op, "cudnnSetPooling2dDescriptor",
                            api->set_pool_2d(pd, mode, CUDNN_PROPAGATE_NAN, (int)k[0], (int)k[1],
                                             (int)pad[0], (int)pad[1], (int)s[0], (int)s[1]));
    if (!rc) {
        /* the compute type's scalars: double for DOUBLE data, float otherwise */
        float one = 1.0f, zero = 0.0f;
        double one64 = 1.0, zero64 = 0.0;
        bool f64 = x->dtype == MT_F64;
        rc = mt_cudnn_check(op, "cudnnPoolingForward",
                            api->pool_fwd(h, pd, f64 ? (const void *)&one64 : &one, xd,
                                          mt_tensor_data(x), f64 ? (const void *)&zero64 : &zero,
                                          yd, mt_tensor_data(y)));
    }
    if (pd) api->destroy_pool(pd);
    if (xd) api->destroy_tensor(xd);
    if (yd) api->destroy_tensor(yd);
    return rc;
}
