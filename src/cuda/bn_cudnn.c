/* Batch norm in training through cuDNN (cudnnBatchNormalizationForwardTraining and
   cudnnBatchNormalizationBackward, spatial mode): x [N, C, inner...] contiguous is described
   as [N, C, S, 1]; statistics, weight and bias in FP32 (F64 for F64 x), cuDNN's parameter
   type. cuDNN's definitions are the backend's: the batch mean and 1/sqrt(biased var + eps)
   saved, running buffers (either may be absent) updated with the unbiased variance by the
   factor momentum. A missing weight or bias is a temporary of ones or zeros, a gradient not
   wanted a temporary, since cuDNN writes them all. */
#include <limits.h>
#include <math.h>
#include "cudnn_impl.h"

static void ncs(const mt_tensor *x, int64_t *n, int64_t *c, int64_t *s) {
    *n = x->shape[0];
    *c = x->ndim > 1 ? x->shape[1] : 1;
    *s = 1;
    for (int d = 2; d < x->ndim; d++) *s *= x->shape[d];
}

/* BF16 stays on the own kernels: cuDNN's legacy batch norm is documented for HALF, FLOAT and
   DOUBLE activations. */
static bool fits(const mt_tensor *x) {
    int64_t n, c, s;
    ncs(x, &n, &c, &s);
    return x->ndim >= 2 && n > 0 && c > 0 && s > 0 && x->numel <= INT_MAX && mt_is_contiguous(x) &&
           x->dtype != MT_BF16;
}

bool mt_cudnn_bn_applies(const mt_bn_args *a) {
    return a->training && !a->relu && !a->residual && !a->running_mean == !a->running_var &&
           fits(a->x) && mt_cudnn_available();
}

/* cuDNN reads x and dy and writes dx in one data type */
bool mt_cudnn_bn_backward_applies(const mt_bn_backward_args *a) {
    return a->training && !a->y && !a->gres && fits(a->x) && a->gy->dtype == a->x->dtype &&
           mt_is_contiguous(a->gy) && (!a->gx || a->gx->dtype == a->x->dtype) &&
           mt_cudnn_available();
}

static cudnnDataType_t dnn_dtype(mt_dtype dt) {
    return dt == MT_F64    ? CUDNN_DATA_DOUBLE
           : dt == MT_F16  ? CUDNN_DATA_HALF
           : dt == MT_BF16 ? CUDNN_DATA_BFLOAT16
                           : CUDNN_DATA_FLOAT;
}

typedef struct {
    const mt_cudnn_api *api;
    cudnnHandle_t h;
    cudnnTensorDescriptor_t x, p; /* the activation [N, C, S, 1], the parameters [1, C, 1, 1] */
    mt_dtype pdt;                 /* the parameters' dtype */
    mt_device dev;
    int64_t c;
    mt_tensor *tmp[4]; /* temporaries standing in for absent parameters or results */
} bn_call;

static void call_end(bn_call *b) {
    if (b->x) b->api->destroy_tensor(b->x);
    if (b->p) b->api->destroy_tensor(b->p);
    for (int i = 0; i < 4; i++) mt_tensor_unref(b->tmp[i]);
}

static int call_begin(const char *op, bn_call *b, const mt_tensor *x, mt_dtype pdt) {
    *b = (bn_call){0};
    mt_cuda_device_ctx *c = mt_cuda_ctx_get(op, x->device.index);
    b->h = c ? mt_cudnn_handle(op, c) : NULL;
    if (!b->h) return mt_last_status();
    b->api = mt_cudnn_load(op, c->device);
    b->pdt = pdt;
    b->dev = x->device;
    int64_t n, s;
    ncs(x, &n, &b->c, &s);
    int xd[4] = {(int)n, (int)b->c, (int)s, 1}, xs[4] = {(int)(b->c * s), (int)s, 1, 1};
    int pd[4] = {1, (int)b->c, 1, 1}, ps[4] = {(int)b->c, 1, 1, 1};
    int rc = mt_cudnn_check(op, "cudnnCreateTensorDescriptor", b->api->create_tensor(&b->x));
    if (!rc) rc = mt_cudnn_check(op, "cudnnCreateTensorDescriptor", b->api->create_tensor(&b->p));
    if (!rc)
        rc = mt_cudnn_check(op, "cudnnSetTensorNdDescriptor",
                            b->api->set_tensor_nd(b->x, dnn_dtype(x->dtype), 4, xd, xs));
    if (!rc)
        rc = mt_cudnn_check(op, "cudnnSetTensorNdDescriptor",
                            b->api->set_tensor_nd(b->p, dnn_dtype(pdt), 4, pd, ps));
    return rc;
}

/* t's data, or a temporary [C] of the parameters' dtype filled with fill (NAN: uninitialised,
   for results nobody reads) held in slot i. */
static void *param(const char *op, bn_call *b, const mt_tensor *t, int i, double fill, int *rc) {
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

int mt_cudnn_batch_norm(const mt_bn_args *a) {
    const char *op = "mt_batch_norm";
    bn_call b;
    int rc = call_begin(op, &b, a->x, a->save_mean->dtype);
    void *w = param(op, &b, a->weight, 0, 1.0, &rc), *bias = param(op, &b, a->bias, 1, 0.0, &rc);
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
    call_end(&b);
    return rc;
}

int mt_cudnn_batch_norm_backward(const mt_bn_backward_args *a) {
    const char *op = "mt_batch_norm";
    bn_call b;
    int rc = call_begin(op, &b, a->x, a->save_mean->dtype);
    void *w = param(op, &b, a->weight, 0, 1.0, &rc);
    void *gw = param(op, &b, a->gw, 1, NAN, &rc), *gb = param(op, &b, a->gb, 2, NAN, &rc);
    void *gx = NULL;
    if (!rc && a->gx) {
        gx = mt_tensor_data(a->gx);
    } else if (!rc) { /* cuDNN always writes dx */
        b.tmp[3] = mt_tensor_new(op, a->x->ndim, a->x->shape, a->x->dtype, a->x->device);
        rc = b.tmp[3] ? 0 : mt_last_status();
        if (!rc) gx = mt_tensor_data(b.tmp[3]);
    }
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
    call_end(&b);
    return rc;
}
