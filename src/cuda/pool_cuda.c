/* The pooling families of the CUDA backend: the forward through cuDNN where cuDNN computes what
   torch does (pool_cudnn.c), else, and for every backward, the kernels of pool.cu. */
#include "cudnn_impl.h"
#include "pool_kernels.h"

static const char *op_name(mt_pool_kind k) {
    return k == MT_POOL_MAX   ? "mt_max_pool2d"
           : k == MT_POOL_AVG ? "mt_avg_pool2d"
                              : "mt_adaptive_avg_pool2d";
}

static mt_cuda_pool_args pool_args(const mt_tensor *x, const mt_tensor *y,
                                   const mt_pool2d_params *p) {
    mt_cuda_pool_args a = {.dt = x->dtype,
                           .adaptive = p->kind == MT_POOL_ADAPTIVE_AVG,
                           .max = p->kind == MT_POOL_MAX,
                           .count_include_pad = p->count_include_pad,
                           .N = x->shape[0],
                           .C = x->shape[1],
                           .H = x->shape[2],
                           .W = x->shape[3],
                           .OH = y->shape[2],
                           .OW = y->shape[3]};
    for (int i = 0; i < 2; i++) {
        a.kernel[i] = p->kernel[i];
        a.stride[i] = p->stride[i];
        a.padding[i] = p->padding[i];
    }
    for (int i = 0; i < 4; i++) {
        a.xs[i] = x->strides[i];
        a.ys[i] = y->strides[i];
    }
    return a;
}

/* idx is always NULL here: this backend does not set max_pool_indices, so its max-pooling
   backward finds the argmax again from x */
int mt_cuda_be_pool2d(mt_tensor *y, mt_tensor *idx, const mt_tensor *x, const mt_pool2d_params *p) {
    const char *op = op_name(p->kind);
    (void)idx;
    if (y->numel == 0) return 0;
    if (mt_cudnn_pool_expressible(x, y, p)) return mt_cudnn_pool2d(op, y, x, p);
    mt_cuda_device_ctx *c = mt_cuda_ctx_get(op, y->device.index);
    if (!c) return MT_ERR_DEVICE;
    mt_cuda_pool_args a = pool_args(x, y, p);
    a.x = mt_tensor_data(x);
    a.y = mt_tensor_data(y);
    return mt_cuda_check(op, (cudaError_t)mt_cuda_pool2d(&c->kctx, &a));
}

int mt_cuda_be_pool2d_backward(mt_tensor *gx, const mt_tensor *gy, const mt_tensor *x,
                               const mt_tensor *idx, const mt_pool2d_params *p) {
    const char *op = op_name(p->kind);
    (void)idx;
    if (gx->numel == 0) return 0;
    mt_cuda_device_ctx *c = mt_cuda_ctx_get(op, gx->device.index);
    if (!c) return MT_ERR_DEVICE;
    /* x is saved by max pooling only; the geometry is gx's */
    mt_cuda_pool_args a = pool_args(x ? x : gx, gy, p);
    for (int i = 0; i < 4; i++) a.gxs[i] = gx->strides[i];
    a.dt = gx->dtype;
    a.x = x ? mt_tensor_data(x) : NULL;
    a.gy = mt_tensor_data(gy);
    a.gx = mt_tensor_data(gx);
    return mt_cuda_check(op, (cudaError_t)mt_cuda_pool2d_backward(&c->kctx, &a));
}
