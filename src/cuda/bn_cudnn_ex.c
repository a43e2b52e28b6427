/* Batch norm in training on NHWC F16 through cuDNN's Ex entry points
   (cudnnBatchNormalizationForwardTrainingEx / BackwardEx) in persistent spatial mode: the fused
   relu(bn(x) [+ residual]) with bnOps BN_ADD_ACTIVATION (a residual z) or BN_ACTIVATION and a
   RELU activation descriptor, and the plain bn(x) (no activation, no residual: ResNet's
   projection shortcuts) with bnOps BN, no activation descriptor and no z. cuDNN documents the
   activation ops for NHWC fully packed HALF activations with FLOAT parameters and statistics
   and C a multiple of 4; the plain one takes the same configurations here, which is what
   PyTorch runs for channels-last half batch norm: on NHWC data these calls get cuDNN's
   semi-persistent NHWC kernels, where the legacy plain calls (bn_cudnn.c) run its NCHW ones on
   strided data (measured with ncu on an H200, ResNet-50 at batch 128: 1.7 ms forward and 18.9
   ms backward for one shortcut, against 0.05 to 0.4 ms for the NHWC kernels). Everything else
   stays on the legacy calls or the own kernels (cuda_norm.c). The forward's reserve space (the
   ReLU mask cuDNN's backward reads, whatever cuDNN keeps under bnOps BN) is a device buffer the
   tape node owns through its state block, with the bnOps and the epsilon the backward must
   repeat; the saved mean and inverse variance are the node's saved tensors; the workspaces come
   from the caching allocator for one call each. The backward gives dx, dz (the residual's
   gradient), dscale and dbias in one call. cuDNN warns that the persistent mode can overflow
   for inputs of a very large range; torch takes the same mode for channels-last training. The
   ReLU propagates NaN, as torch's. */
#include <math.h>
#include <stdlib.h>
#include "cudnn_impl.h"

typedef struct {
    mt_tensor *reserve; /* cuDNN's reserve space as bytes (MT_BOOL), NULL when 0 bytes */
    size_t reserve_bytes;
    double eps;
    cudnnBatchNormOps_t ops; /* BN (plain), BN_ACTIVATION, BN_ADD_ACTIVATION (a residual) */
} ex_state;

static void ex_state_free(void *p) {
    ex_state *s = p;
    mt_tensor_unref(s->reserve);
    free(s);
}

static cudnnBatchNormOps_t forward_ops(const mt_bn_args *a) {
    return a->residual ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
           : a->relu   ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION
                       : CUDNN_BATCHNORM_OPS_BN;
}

/* A residual only with the ReLU: cuDNN has no add without an activation. */
bool mt_cudnn_bn_ex_applies(const mt_bn_args *a) {
    const mt_tensor *x = a->x, *r = a->residual;
    /* eps 0 (a constant channel's rstd 0, as torch) is the own kernels' */
    return a->training && a->state && a->eps >= CUDNN_BN_MIN_EPSILON && a->eps > 0 &&
           x->dtype == MT_F16 && mt_cuda_bn_nhwc(x) && x->shape[1] % 4 == 0 &&
           mt_cudnn_bn_fits(x, true) && a->save_mean->dtype == MT_F32 &&
           !a->running_mean == !a->running_var &&
           (!r || (a->relu && r->dtype == x->dtype && mt_cuda_bn_nhwc(r))) && mt_cudnn_available();
}

static bool like_x(const mt_tensor *t, const mt_tensor *x) {
    return !t || (t->dtype == x->dtype && mt_cuda_bn_nhwc(t));
}

/* The plain forward saved no y (none is needed) and has no residual to give a gradient. */
bool mt_cudnn_bn_ex_backward_applies(const mt_bn_backward_args *a) {
    const ex_state *s = a->state;
    if (!s || !a->training || !like_x(a->gy, a->x) || !like_x(a->gx, a->x) ||
        !like_x(a->gres, a->x))
        return false;
    if (s->ops == CUDNN_BATCHNORM_OPS_BN) return !a->gres;
    return a->y && like_x(a->y, a->x) &&
           (s->ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION || !a->gres);
}

static const char *op_name(cudnnBatchNormOps_t ops) {
    return ops == CUDNN_BATCHNORM_OPS_BN ? "mt_batch_norm" : "mt_batch_norm_act";
}

/* The RELU descriptor (NaN propagated, as torch's relu); none (NULL) for bnOps BN */
static int relu_desc(const char *op, const mt_cudnn_bn_call *b, cudnnBatchNormOps_t ops,
                     cudnnActivationDescriptor_t *d) {
    *d = NULL;
    if (ops == CUDNN_BATCHNORM_OPS_BN) return 0;
    int rc = mt_cudnn_check(op, "cudnnCreateActivationDescriptor", b->api->create_act(d));
    if (!rc)
        rc = mt_cudnn_check(op, "cudnnSetActivationDescriptor",
                            b->api->set_act(*d, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
    return rc;
}

/* A workspace of the size cuDNN asked for, from the caching allocator (NULL for 0 bytes). */
static int workspace(const char *op, const mt_cudnn_bn_call *b, size_t bytes, void **out) {
    *out = NULL;
    if (bytes == 0) return 0;
    *out = mt_cuda_alloc(b->ctx->device, bytes);
    if (!*out)
        return mt_error_set(
            MT_ERR_OOM, "%s: out of device memory for a cuDNN workspace of %zu bytes", op, bytes);
    return 0;
}

/* A size query's status: a configuration cuDNN does not support (the NOT_SUPPORTED family)
   declines the Ex path before anything ran, without an error; other failures are errors. */
static int size_query(const char *op, const char *what, cudnnStatus_t s) {
    if ((int)s / 1000 * 1000 == CUDNN_STATUS_NOT_SUPPORTED) return MT_CUDNN_BN_EX_DECLINED;
    return mt_cudnn_check(op, what, s);
}

static int ex_forward_call(const char *op, const mt_bn_args *a, mt_cudnn_bn_call *b,
                           cudnnActivationDescriptor_t act, ex_state *st) {
    cudnnBatchNormOps_t ops = st->ops;
    cudnnTensorDescriptor_t zd = a->residual ? b->x : NULL;
    int rc = 0;
    void *w = mt_cudnn_bn_param(op, b, a->weight, 0, 1.0, &rc);
    void *bias = mt_cudnn_bn_param(op, b, a->bias, 1, 0.0, &rc);
    size_t wsb = 0;
    if (!rc)
        rc = size_query(op, "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize",
                        b->api->bn_fwd_ex_workspace(b->h, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, ops,
                                                    b->x, zd, b->x, b->p, act, &wsb));
    if (!rc)
        rc = size_query(op, "cudnnGetBatchNormalizationTrainingExReserveSpaceSize",
                        b->api->bn_ex_reserve(b->h, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, ops, act,
                                              b->x, &st->reserve_bytes));
    if (!rc && st->reserve_bytes > 0) {
        int64_t n = (int64_t)st->reserve_bytes;
        st->reserve = mt_tensor_new(op, 1, &n, MT_BOOL, a->x->device);
        if (!st->reserve) rc = mt_last_status();
    }
    void *ws = NULL;
    if (!rc) rc = workspace(op, b, wsb, &ws);
    if (!rc) {
        float one = 1.0f, zero = 0.0f;
        rc = mt_cudnn_check(
            op, "cudnnBatchNormalizationForwardTrainingEx",
            b->api->bn_fwd_train_ex(
                b->h, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, ops, &one, &zero, b->x,
                mt_tensor_data(a->x), zd, a->residual ? mt_tensor_data(a->residual) : NULL, b->x,
                mt_tensor_data(a->y), b->p, w, bias, a->momentum,
                a->running_mean ? mt_tensor_data(a->running_mean) : NULL,
                a->running_var ? mt_tensor_data(a->running_var) : NULL, a->eps,
                mt_tensor_data(a->save_mean), mt_tensor_data(a->save_rstd), act, ws, wsb,
                st->reserve ? mt_tensor_data(st->reserve) : NULL, st->reserve_bytes));
    }
    if (ws) mt_cuda_free(b->ctx->device, ws, wsb); /* stream order keeps it for the call */
    return rc;
}

int mt_cudnn_batch_norm_ex(const mt_bn_args *a) {
    cudnnBatchNormOps_t ops = forward_ops(a);
    const char *op = op_name(ops);
    ex_state *st = mt_heap_calloc(1, sizeof *st);
    if (!st) return mt_error_set(MT_ERR_OOM, "%s: out of memory for the cuDNN state", op);
    st->eps = a->eps;
    st->ops = ops;
    mt_cudnn_bn_call b;
    cudnnActivationDescriptor_t act = NULL;
    int rc = mt_cudnn_bn_begin(op, &b, a->x, a->save_mean->dtype);
    if (!rc) rc = relu_desc(op, &b, ops, &act);
    if (!rc) rc = ex_forward_call(op, a, &b, act, st);
    if (act) b.api->destroy_act(act);
    mt_cudnn_bn_end(&b);
    if (rc) { /* declined or failed: nothing ran, the running statistics are as they were */
        ex_state_free(st);
        return rc;
    }
    a->state->state = st;
    a->state->free_fn = ex_state_free;
    return 0;
}

static int ex_backward_call(const char *op, const mt_bn_backward_args *a, mt_cudnn_bn_call *b,
                            cudnnActivationDescriptor_t act, const ex_state *st) {
    cudnnBatchNormOps_t ops = st->ops;
    bool add = ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION, plain = ops == CUDNN_BATCHNORM_OPS_BN;
    cudnnTensorDescriptor_t dzd = add ? b->x : NULL;
    /* y and the bias: read under an activation only (cuDNN takes NULL for bnOps BN, as
       PyTorch passes; the size query gets y's descriptor, which is x's, as PyTorch's does) */
    cudnnTensorDescriptor_t yd = plain ? NULL : b->x;
    int rc = 0;
    void *w = mt_cudnn_bn_param(op, b, a->weight, 0, 1.0, &rc);
    void *bias = plain ? NULL : mt_cudnn_bn_param(op, b, a->bias, 1, 0.0, &rc);
    void *gw = mt_cudnn_bn_param(op, b, a->gw, 2, NAN, &rc);
    void *gb = mt_cudnn_bn_param(op, b, a->gb, 3, NAN, &rc);
    /* cuDNN writes dx, and dz under BN_ADD_ACTIVATION: temporaries where not wanted */
    void *gx = mt_cudnn_bn_activation(op, b, a->gx, a->x, 4, &rc);
    void *gz = add ? mt_cudnn_bn_activation(op, b, a->gres, a->x, 5, &rc) : NULL;
    size_t wsb = 0;
    if (!rc)
        rc = mt_cudnn_check(op, "cudnnGetBatchNormalizationBackwardExWorkspaceSize",
                            b->api->bn_bwd_ex_workspace(b->h, CUDNN_BATCHNORM_SPATIAL_PERSISTENT,
                                                        ops, b->x, b->x, b->x, dzd, b->x, b->p, act,
                                                        &wsb));
    void *ws = NULL;
    if (!rc) rc = workspace(op, b, wsb, &ws);
    if (!rc) {
        float one = 1.0f, zero = 0.0f;
        rc = mt_cudnn_check(
            op, "cudnnBatchNormalizationBackwardEx",
            b->api->bn_bwd_ex(
                b->h, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, ops, &one, &zero, &one, &zero, b->x,
                mt_tensor_data(a->x), yd, plain ? NULL : mt_tensor_data(a->y), b->x,
                mt_tensor_data(a->gy), dzd, gz, b->x, gx, b->p, w, bias, gw, gb, st->eps,
                mt_tensor_data(a->save_mean), mt_tensor_data(a->save_rstd), act, ws, wsb,
                st->reserve ? mt_tensor_data(st->reserve) : NULL, st->reserve_bytes));
    }
    if (ws) mt_cuda_free(b->ctx->device, ws, wsb);
    return rc;
}

int mt_cudnn_batch_norm_ex_backward(const mt_bn_backward_args *a) {
    const ex_state *st = a->state;
    const char *op = op_name(st->ops);
    mt_cudnn_bn_call b;
    cudnnActivationDescriptor_t act = NULL;
    int rc = mt_cudnn_bn_begin(op, &b, a->x, a->save_mean->dtype);
    if (!rc) rc = relu_desc(op, &b, st->ops, &act);
    if (!rc) rc = ex_backward_call(op, a, &b, act, a->state);
    if (act) b.api->destroy_act(act);
    mt_cudnn_bn_end(&b);
    return rc;
}
