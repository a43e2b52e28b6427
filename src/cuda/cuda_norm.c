/* The host side of the normalisation, dropout and indexing families on CUDA: the tensors of
   the backend call (contiguous, checked by the op) become the plain launch arguments of
   kernels.h (norm.cu, index.cu). Batch norm runs through cuDNN where cuDNN computes it as
   torch does: in training on F16, NHWC with C a multiple of 4 through the Ex calls
   (bn_cudnn_ex.c: the fused residual + ReLU, the ReLU alone, and the plain one) and the rest
   through the legacy plain calls, in eval the plain one (bn_cudnn.c); the own kernels run the
   rest, F32 and F64 training included: their statistics are sums of shifted values in double,
   where cuDNN's FP32 sums lost digits on offset data on an H200 (bn_cudnn.c says more). */
#include "cudnn_impl.h"

static mt_cuda_device_ctx *ctx_for(const char *op, const mt_tensor *t) {
    return mt_cuda_ctx_get(op, t->device.index);
}

static int launched(const char *op, int status) {
    return mt_cuda_check(op, (cudaError_t)status);
}

static char *data_or_null(const mt_tensor *t) {
    return t ? mt_tensor_data(t) : NULL;
}

/* What the forward and the backward share: rows of D normalised values, their statistics
   and the weight. */
static mt_cuda_layer_norm_args ln_args(const mt_tensor *x, const mt_tensor *mean,
                                       const mt_tensor *rstd, const mt_tensor *weight) {
    int64_t rows = mean->numel;
    return (mt_cuda_layer_norm_args){.rows = rows,
                                     .D = rows ? x->numel / rows : 0,
                                     .wide = mean->dtype == MT_F64,
                                     .x = mt_tensor_data(x),
                                     .xdt = x->dtype,
                                     .weight = data_or_null(weight),
                                     .mean = mt_tensor_data(mean),
                                     .rstd = mt_tensor_data(rstd)};
}

int mt_cuda_be_layer_norm(mt_tensor *y, mt_tensor *mean, mt_tensor *rstd, const mt_tensor *x,
                          const mt_tensor *weight, const mt_tensor *bias, double eps) {
    mt_cuda_device_ctx *c = ctx_for("mt_layer_norm", x);
    if (!c) return MT_ERR_DEVICE;
    mt_cuda_layer_norm_args a = ln_args(x, mean, rstd, weight);
    a.y = mt_tensor_data(y);
    a.ydt = y->dtype;
    a.bias = data_or_null(bias);
    a.eps = eps;
    return launched("mt_layer_norm", mt_cuda_layer_norm(&c->kctx, &a));
}

int mt_cuda_be_layer_norm_backward(mt_tensor *gx, mt_tensor *gw, mt_tensor *gb, const mt_tensor *gy,
                                   const mt_tensor *x, const mt_tensor *mean, const mt_tensor *rstd,
                                   const mt_tensor *weight) {
    mt_cuda_device_ctx *c = ctx_for("mt_layer_norm", x);
    if (!c) return MT_ERR_DEVICE;
    mt_cuda_layer_norm_args a = ln_args(x, mean, rstd, weight);
    a.gy = mt_tensor_data(gy);
    a.gydt = gy->dtype;
    a.gx = data_or_null(gx);
    a.gxdt = gx ? gx->dtype : x->dtype;
    a.gw = data_or_null(gw);
    a.gb = data_or_null(gb);
    return launched("mt_layer_norm", mt_cuda_layer_norm_backward(&c->kctx, &a));
}

/* [N, C, S] of an [N, C, ...] tensor */
static void ncs(const mt_tensor *x, int64_t *N, int64_t *C, int64_t *S) {
    *N = x->shape[0];
    *C = x->ndim > 1 ? x->shape[1] : 1;
    *S = 1;
    for (int d = 2; d < x->ndim; d++) *S *= x->shape[d];
}

/* dense channels-last 4-d activations (the op hands NCHW contiguous ones otherwise) */
bool mt_cuda_bn_nhwc(const mt_tensor *x) {
    return x->ndim == 4 && !mt_is_contiguous(x) && mt_is_channels_last(x);
}

int mt_cuda_be_batch_norm(const mt_bn_args *b) {
    if (mt_cudnn_bn_ex_applies(b)) {
        int rc = mt_cudnn_batch_norm_ex(b);
        if (rc != MT_CUDNN_BN_EX_DECLINED) return rc;
    }
    if (mt_cudnn_bn_applies(b)) return mt_cudnn_batch_norm(b);
    if (mt_cudnn_bn_eval_applies(b)) return mt_cudnn_batch_norm_eval(b);
    mt_cuda_device_ctx *c = ctx_for("mt_batch_norm", b->x);
    if (!c) return MT_ERR_DEVICE;
    mt_cuda_batch_norm_args a = {.wide = b->save_mean->dtype == MT_F64,
                                 .training = b->training,
                                 .relu = b->relu,
                                 .nhwc = mt_cuda_bn_nhwc(b->x),
                                 .x = mt_tensor_data(b->x),
                                 .residual = data_or_null(b->residual),
                                 .y = mt_tensor_data(b->y),
                                 .xdt = b->x->dtype,
                                 .weight = data_or_null(b->weight),
                                 .bias = data_or_null(b->bias),
                                 .running_mean = data_or_null(b->running_mean),
                                 .running_var = data_or_null(b->running_var),
                                 .save_mean = mt_tensor_data(b->save_mean),
                                 .save_rstd = mt_tensor_data(b->save_rstd),
                                 .momentum = b->momentum,
                                 .eps = b->eps};
    ncs(b->x, &a.N, &a.C, &a.S);
    if (a.N * a.S == 0) return 0;
    return launched("mt_batch_norm", mt_cuda_batch_norm(&c->kctx, &a));
}

int mt_cuda_be_batch_norm_backward(const mt_bn_backward_args *b) {
    /* the forward's choice; its saved y lets the own kernels stand in where the gradients'
       dtypes or layouts are not the Ex call's */
    if (b->state && mt_cudnn_bn_ex_backward_applies(b)) return mt_cudnn_batch_norm_ex_backward(b);
    if (mt_cudnn_bn_backward_applies(b)) return mt_cudnn_batch_norm_backward(b);
    mt_cuda_device_ctx *c = ctx_for("mt_batch_norm", b->x);
    if (!c) return MT_ERR_DEVICE;
    mt_cuda_batch_norm_backward_args a = {.wide = b->save_mean->dtype == MT_F64,
                                          .training = b->training,
                                          .nhwc = mt_cuda_bn_nhwc(b->x),
                                          .gy = mt_tensor_data(b->gy),
                                          .x = mt_tensor_data(b->x),
                                          .y = data_or_null(b->y),
                                          .gx = data_or_null(b->gx),
                                          .gres = data_or_null(b->gres),
                                          .gydt = b->gy->dtype,
                                          .xdt = b->x->dtype,
                                          .gxdt = b->gx ? b->gx->dtype : b->x->dtype,
                                          .gresdt = b->gres ? b->gres->dtype : b->x->dtype,
                                          .weight = data_or_null(b->weight),
                                          .save_mean = mt_tensor_data(b->save_mean),
                                          .save_rstd = mt_tensor_data(b->save_rstd),
                                          .gw = data_or_null(b->gw),
                                          .gb = data_or_null(b->gb)};
    ncs(b->x, &a.N, &a.C, &a.S);
    if (a.N * a.S == 0) return 0;
    return launched("mt_batch_norm", mt_cuda_batch_norm_backward(&c->kctx, &a));
}

int mt_cuda_be_dropout(mt_tensor *out, const mt_tensor *x, double p, uint64_t seed,
                       uint64_t offset) {
    mt_cuda_device_ctx *c = ctx_for("mt_dropout", x);
    if (!c) return MT_ERR_DEVICE;
    return launched("mt_dropout", mt_cuda_dropout(&c->kctx, mt_tensor_data(out), mt_tensor_data(x),
                                                  x->dtype, x->numel, p, seed, offset));
}

static mt_cuda_index_args index_args(const mt_tensor *src, const mt_tensor *dst,
                                     const mt_tensor *shaped, int dim, const mt_tensor *index) {
    mt_cuda_index_args a = {.src = mt_tensor_data(src),
                            .dst = mt_tensor_data(dst),
                            .index = index ? mt_tensor_data(index) : NULL,
                            .k = index ? index->numel : 0,
                            .es = (int)mt_dtype_size(src->dtype),
                            .sdt = src->dtype,
                            .ddt = dst->dtype};
    mt_split_at_dim(shaped, dim, &a.outer, &a.n, &a.inner);
    return a;
}

int mt_cuda_be_index_select(mt_tensor *out, const mt_tensor *x, int dim, const mt_tensor *index,
                            mt_op_id op) {
    mt_cuda_device_ctx *c = ctx_for("mt_index_select", x);
    if (!c) return MT_ERR_DEVICE;
    mt_cuda_index_args a = index_args(x, out, x, dim, index);
    a.op = (int)op;
    a.dim = dim;
    return launched("mt_index_select", mt_cuda_index_select(&c->kctx, &a));
}

int mt_cuda_be_index_add(mt_tensor *dst, int dim, const mt_tensor *index, const mt_tensor *src) {
    mt_cuda_device_ctx *c = ctx_for("mt_index_select", dst);
    if (!c) return MT_ERR_DEVICE;
    mt_cuda_index_args a = index_args(src, dst, dst, dim, index);
    return launched("mt_index_select", mt_cuda_index_add(&c->kctx, &a));
}

int mt_cuda_be_argmax(mt_tensor *out, const mt_tensor *x, int dim) {
    mt_cuda_device_ctx *c = ctx_for("mt_argmax", x);
    if (!c) return MT_ERR_DEVICE;
    mt_cuda_index_args a = index_args(x, out, x, dim, NULL);
    return launched("mt_argmax", mt_cuda_argmax(&c->kctx, &a));
}

static mt_cuda_gather_args gather_args(const mt_tensor *x, const mt_tensor *out,
                                       const mt_tensor *index, const mt_tensor *shaped_x, int dim,
                                       int64_t numel) {
    mt_cuda_gather_args a = {.x = mt_tensor_data(x),
                             .out = mt_tensor_data(out),
                             .index = mt_tensor_data(index),
                             .nd = index->ndim,
                             .dim = dim,
                             .user_dim = dim,
                             .es = (int)mt_dtype_size(x->dtype),
                             .numel = numel,
                             .sdt = x->dtype,
                             .ddt = out->dtype};
    for (int d = 0; d < index->ndim; d++) a.index_shape[d] = index->shape[d];
    mt_contiguous_strides(index->ndim, index->shape, a.index_strides);
    for (int d = 0; d < shaped_x->ndim; d++) a.x_shape[d] = shaped_x->shape[d];
    mt_contiguous_strides(shaped_x->ndim, shaped_x->shape, a.x_strides);
    if (index->ndim == 0) { /* a 0-d index: one position along a virtual dim of size 1 */
        a.nd = 1;
        a.dim = 0;
        a.index_shape[0] = a.x_shape[0] = 1;
        a.index_strides[0] = a.x_strides[0] = 1;
    }
    return a;
}

int mt_cuda_be_gather(mt_tensor *out, const mt_tensor *x, int dim, const mt_tensor *index) {
    mt_cuda_device_ctx *c = ctx_for("mt_gather", x);
    if (!c) return MT_ERR_DEVICE;
    mt_cuda_gather_args a = gather_args(x, out, index, x, dim, index->numel);
    return launched("mt_gather", mt_cuda_gather(&c->kctx, &a));
}

int mt_cuda_be_scatter_add(mt_tensor *dst, int dim, const mt_tensor *index, const mt_tensor *src) {
    mt_cuda_device_ctx *c = ctx_for("mt_gather", dst);
    if (!c) return MT_ERR_DEVICE;
    mt_cuda_gather_args a = gather_args(src, dst, index, dst, dim, dst->numel);
    return launched("mt_gather", mt_cuda_scatter_add(&c->kctx, &a));
}
