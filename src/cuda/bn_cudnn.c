/* Batch norm through cuDNN's plain calls: in training cudnnBatchNormalizationForwardTraining
   and cudnnBatchNormalizationBackward for F16 activations (NCHW ones, and NHWC ones that
   bn_cudnn_ex.c's Ex calls do not take: C not a multiple of 4, or a configuration cuDNN's
   size queries decline; on NHWC data these calls run cuDNN's NCHW-oriented kernels, many
   times slower), in eval cudnnBatchNormalizationForwardInference (spatial mode). x [N, C,
   inner...] contiguous (or dense NHWC) is described as [N, C, S, 1]; statistics, weight and
   bias in FP32 (F64 for F64 x), cuDNN's parameter type. cuDNN's definitions are the
   backend's: the batch mean and 1/sqrt(biased var + eps) saved, running buffers (either may
   be absent) updated with the unbiased variance by the factor momentum. A missing weight or
   bias is a temporary of ones or zeros, a gradient not wanted a temporary, since cuDNN writes
   them all.
   F32 and F64 training stay on the own kernels (norm.cu), forward and backward: cuDNN's
   training statistics are FP32 sums that lose digits on offset data, where the own kernels
   sum values shifted by the channel's first one in double, as the CPU backend does. Measured
   on an H200 (cuDNN 9): the golden case batch_norm offset_train_f32 (inputs 100 +- 0.01) came
   out 3.68e-06 off through cuDNN against an F32 tolerance of 2.65e-06. F16 keeps cuDNN (its
   own rounding dwarfs that), and so does eval, which computes no statistics. */
#include <limits.h>
#include <math.h>
#include "cudnn_impl.h"

static void ncs(const mt_tensor *x, int64_t *n, int64_t *c, int64_t *s) {
    *n = x->shape[0];
    *c = x->ndim > 1 ? x->shape[1] : 1;
    *s = 1;
    for (int d = 2; d < x->ndim; d++) *s *= x->shape[d];
}

/* The batch goes into a grid dimension of cuDNN's kernels: PyTorch (aten Normalization.cpp,
   since pytorch#32763 for cuDNN 7.6) uses them only up to these batches. */
#define BN_MAX_BATCH_TRAINING  880801
#define BN_MAX_BATCH_INFERENCE 65535

bool mt_cudnn_bn_fits(const mt_tensor *x, bool training) {
    int64_t n, c, s;
    ncs(x, &n, &c, &s);
    return x->ndim >= 2 && n > 0 && c > 0 && s > 0 && x->numel <= INT_MAX &&
           n <= (training ? BN_MAX_BATCH_TRAINING : BN_MAX_BATCH_INFERENCE) &&
           (mt_is_contiguous(x) || mt_cuda_bn_nhwc(x));
}

/* BF16 stays on the own kernels: cuDNN's legacy batch norm is documented for HALF, FLOAT and
   DOUBLE activations. */
static bool fits(const mt_tensor *x, bool training) {
    return mt_cudnn_bn_fits(x, training) && x->dtype != MT_BF16;
}

static bool same_layout(const mt_tensor *a, const mt_tensor *x) {
    return mt_cuda_bn_nhwc(a) == mt_cuda_bn_nhwc(x) && (mt_is_contiguous(a) || mt_cuda_bn_nhwc(a));
}

/* Training through cuDNN: F16 activations only (F32 and F64 statistics are the own kernels',
   see the top of this file). */
static bool fits_training(const mt_tensor *x) {
    return x->dtype == MT_F16 && fits(x, true);
}

bool mt_cudnn_bn_applies(const mt_bn_args *a) {
    return a->training && !a->relu && !a->residual && !a->running_mean == !a->running_var &&
           a->eps >= CUDNN_BN_MIN_EPSILON && a->eps > 0 && fits_training(a->x) &&
           mt_cudnn_available();
}

/* cuDNN reads x and dy and writes dx in one data type and layout */
bool mt_cudnn_bn_backward_applies(const mt_bn_backward_args *a) {
    return a->training && !a->y && !a->gres && fits_training(a->x) && a->gy->dtype == a->x->dtype &&
           same_layout(a->gy, a->x) &&
           (!a->gx || (a->gx->dtype == a->x->dtype && same_layout(a->gx, a->x))) &&
           mt_cudnn_available();
}

/* cuDNN's inference is torch's eval (spatial, the running statistics; epsilon at least its
   minimum). It writes y only: the saved statistics come from a small kernel. */
bool mt_cudnn_bn_eval_applies(const mt_bn_args *a) {
    return !a->training && !a->relu && !a->residual && a->running_mean && a->running_var &&
           a->eps >= CUDNN_BN_MIN_EPSILON && fits(a->x, false) && mt_cudnn_available();
}

cudnnDataType_t mt_cudnn_dtype(mt_dtype dt) {
    return dt == MT_F64    ? CUDNN_DATA_DOUBLE
           : dt == MT_F16  ? CUDNN_DATA_HALF
           : dt == MT_BF16 ? CUDNN_DATA_BFLOAT16
                           : CUDNN_DATA_FLOAT;
}

void mt_cudnn_bn_end(mt_cudnn_bn_call *b) {
    if (b->x) b->api->destroy_tensor(b->x);
    if (b->p) b->api->destroy_tensor(b->p);
    for (int i = 0; i < 6; i++) mt_tensor_unref(b->tmp[i]);
}

int mt_cudnn_bn_begin(const char *op, mt_cudnn_bn_call *b, const mt_tensor *x, mt_dtype pdt) {
    *b = (mt_cudnn_bn_call){0};
    b->ctx = mt_cuda_ctx_get(op, x->device.index);
    b->h = b->ctx ? mt_cudnn_handle(op, b->ctx) : NULL;
    if (!b->h) return mt_last_status();
    b->api = mt_cudnn_load(op, b->ctx->device);
    b->pdt = pdt;
    b->dev = x->device;
    int64_t n, s;
    ncs(x, &n, &b->c, &s);
    /* [N, C, S, 1]: NCHW strides, or NHWC ones (a dense NHWC tensor with H = S, W = 1) */
    int xd[4] = {(int)n, (int)b->c, (int)s, 1};
    int xs[4] = {(int)(b->c * s), (int)s, 1, 1};
    if (mt_cuda_bn_nhwc(x)) {
        xs[1] = 1;
        xs[2] = xs[3] = (int)b->c;
    }
    int pd[4] = {1, (int)b->c, 1, 1}, ps[4] = {(int)b->c, 1, 1, 1};
    int rc = mt_cudnn_check(op, "cudnnCreateTensorDescriptor", b->api->create_tensor(&b->x));
    if (!rc) rc = mt_cudnn_check(op, "cudnnCreateTensorDescriptor", b->api->create_tensor(&b->p));
    if (!rc)
        rc = mt_cudnn_check(op, "cudnnSetTensorNdDescriptor",
                            b->api->set_tensor_nd(b->x, mt_cudnn_dtype(x->dtype), 4, xd, xs));
    if (!rc)
        rc = mt_cudnn_check(op, "cudnnSetTensorNdDescriptor",
                            b->api->set_tensor_nd(b->p, mt_cudnn_dtype(pdt), 4, pd, ps));
    return rc;
}

void *mt_cudnn_bn_param(const char *op, mt_cudnn_bn_call *b, const mt_tensor *t, int i, double fill,
                        int *rc) {
    if (*rc) return NULL;
    if (t) return mt_tensor_data(t);
    b->tmp[i] = mt_tensor_new(op, 1, &b->c, b->pdt, b->dev);
    if (!b->tmp[i]) {
        *rc = mt_last_status();
        return NULL;
    }
    if (fill == fill) *rc = mt_cuda_backend.fill(b->tmp[i], fill);
    return *rc ? NULL : mt_tensor_data(b->tmp[i]);
}

void *mt_cudnn_bn_activation(const char *op, mt_cudnn_bn_call *b, const mt_tensor *t,
                             const mt_tensor *x, int i, int *rc) {
    if (*rc) return NULL;
    if (t) return mt_tensor_data(t);
    b->tmp[i] = mt_cuda_bn_nhwc(x) ? mt_tensor_new_format(op, x->shape, x->dtype, x->device, true)
                                   : mt_tensor_new(op, x->ndim, x->shape, x->dtype, x->device);
    if (!b->tmp[i]) {
        *rc = mt_last_status();
        return NULL;
    }
    return mt_tensor_data(b->tmp[i]);
}

int mt_cudnn_batch_norm(const mt_bn_args *a) {
    const char *op = "mt_batch_norm";
    mt_cudnn_bn_call b;
    int rc = mt_cudnn_bn_begin(op, &b, a->x, a->save_mean->dtype);
    void *w = mt_cudnn_bn_param(op, &b, a->weight, 0, 1.0, &rc),
         *bias = mt_cudnn_bn_param(op, &b, a->bias, 1, 0.0, &rc);
    if (!rc) {
        float one = 1.0f, zero = 0.0f; /* blend factors: float for every data type but double */
        double one64 = 1.0, zero64 = 0.0;
        bool f64 = a->x->dtype == MT_F64;
        rc = mt_cudnn_check(
            op, "cudnnBatchNormalizationForwardTraining",
            b.api->bn_fwd_train(b.h, CUDNN_BATCHNORM_SPATIAL, f64 ? (const void *)&one64 : &one,
                                f64 ? (const void *)&zero64 : &zero, b.x, mt_tensor_data(a->x), b.x,
                                mt_tensor_data(a->y), b.p, w, bias, a->momentum,
                                a->running_mean ? mt_tensor_data(a->running_mean) : NULL,
                                a->running_var ? mt_tensor_data(a->running_var) : NULL, a->eps,
                                mt_tensor_data(a->save_mean), mt_tensor_data(a->save_rstd)));
    }
    mt_cudnn_bn_end(&b);
    return rc;
}

int mt_cudnn_batch_norm_backward(const mt_bn_backward_args *a) {
    const char *op = "mt_batch_norm";
    mt_cudnn_bn_call b;
    int rc = mt_cudnn_bn_begin(op, &b, a->x, a->save_mean->dtype);
    void *w = mt_cudnn_bn_param(op, &b, a->weight, 0, 1.0, &rc);
    void *gw = mt_cudnn_bn_param(op, &b, a->gw, 1, NAN, &rc),
         *gb = mt_cudnn_bn_param(op, &b, a->gb, 2, NAN, &rc);
    void *gx = mt_cudnn_bn_activation(op, &b, a->gx, a->x, 3, &rc); /* cuDNN always writes dx */
    if (!rc) {
        float one = 1.0f, zero = 0.0f;
        double one64 = 1.0, zero64 = 0.0;
        const void *o = a->x->dtype == MT_F64 ? (const void *)&one64 : &one;
        const void *z = a->x->dtype == MT_F64 ? (const void *)&zero64 : &zero;
        /* with the saved mean and 1/sqrt(var + eps) given, cuDNN does not use epsilon (the
           backend's backward does not carry it): the smallest it accepts */
        rc = mt_cudnn_check(
            op, "cudnnBatchNormalizationBackward",
            b.api->bn_bwd(b.h, CUDNN_BATCHNORM_SPATIAL, o, z, o, z, b.x, mt_tensor_data(a->x), b.x,
                          mt_tensor_data(a->gy), b.x, gx, b.p, w, gw, gb, CUDNN_BN_MIN_EPSILON,
                          mt_tensor_data(a->save_mean), mt_tensor_data(a->save_rstd)));
    }
    mt_cudnn_bn_end(&b);
    return rc;
}

int mt_cudnn_batch_norm_eval(const mt_bn_args *a) {
    const char *op = "mt_batch_norm";
    mt_cudnn_bn_call b;
    int rc = mt_cudnn_bn_begin(op, &b, a->x, a->save_mean->dtype);
    void *w = mt_cudnn_bn_param(op, &b, a->weight, 0, 1.0, &rc);
    void *bias = mt_cudnn_bn_param(op, &b, a->bias, 1, 0.0, &rc);
    if (!rc) {
        float one = 1.0f, zero = 0.0f;
        double one64 = 1.0, zero64 = 0.0;
        bool f64 = a->x->dtype == MT_F64;
        rc = mt_cudnn_check(
            op, "cudnnBatchNormalizationForwardInference",
            b.api->bn_fwd_infer(b.h, CUDNN_BATCHNORM_SPATIAL, f64 ? (const void *)&one64 : &one,
                                f64 ? (const void *)&zero64 : &zero, b.x, mt_tensor_data(a->x), b.x,
                                mt_tensor_data(a->y), b.p, w, bias, mt_tensor_data(a->running_mean),
                                mt_tensor_data(a->running_var), a->eps));
    }
    if (!rc)
        rc = mt_cuda_check(op,
                           (cudaError_t)mt_cuda_bn_eval_stats(
                               &b.ctx->kctx, a->save_mean->dtype == MT_F64, b.c,
                               mt_tensor_data(a->running_mean), mt_tensor_data(a->running_var),
                               a->eps, mt_tensor_data(a->save_mean), mt_tensor_data(a->save_rstd)));
    mt_cudnn_bn_end(&b);
    return rc;
}
