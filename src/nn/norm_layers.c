/* Normalisation layers like torch.nn.BatchNorm2d and torch.nn.LayerNorm: weight 1, bias 0,
   running mean 0 and variance 1, momentum 0.1, eps 1e-5. Each layer has its own `training`
   flag (no global train/eval mode). Their weight and bias are marked for mt_amp_decorate to
   keep in FP32 under O2 (mt_set_amp_keep_fp32). */
#include <string.h>
#include "../tensor/tensor_impl.h"

/* A leaf parameter of value v that requires grad, kept FP32 by O2 decorate. */
static mt_tensor *norm_param(int ndim, const int64_t *shape, double v, mt_dtype dt, mt_device dev) {
    mt_tensor *p = mt_full(ndim, shape, dt, dev, v);
    if (p) {
        mt_set_requires_grad(p, true);
        mt_set_amp_keep_fp32(p, true);
    }
    return p;
}

static int check_dtype(const char *op, int arg, mt_dtype dt) {
    if (mt_dtype_is_floating(dt)) return 0;
    return mt_error_set(MT_ERR_DTYPE, "%s: arg %d: parameters must be floating, got %s", op, arg,
                        mt_dtype_name(dt));
}

/* ---------------------------------------------------------------- batch norm 2d */

int mt_batch_norm2d_layer_init(mt_batch_norm2d_layer *l, int64_t channels, mt_dtype dt,
                               mt_device dev) {
    static const char op[] = "mt_batch_norm2d_layer_init";
    if (!l) return mt_error_set(MT_ERR_NULL, "%s: arg 1: layer is NULL", op);
    memset(l, 0, sizeof *l);
    if (channels <= 0)
        return mt_error_set(MT_ERR_INVALID, "%s: arg 2: channels must be positive, got %lld", op,
                            (long long)channels);
    if (check_dtype(op, 3, dt) < 0) return (int)mt_last_status();
    mt_api_enter();
    bool prev = mt_set_grad_enabled(false);
    /* the running buffers have the accumulation dtype the kernels update in place */
    mt_dtype acc = dt == MT_F64 ? MT_F64 : MT_F32;
    const int64_t shape[1] = {channels};
    l->weight = norm_param(1, shape, 1.0, dt, dev);
    l->bias = l->weight ? norm_param(1, shape, 0.0, dt, dev) : NULL;
    l->running_mean = l->bias ? mt_zeros(1, shape, acc, dev) : NULL;
    l->running_var = l->running_mean ? mt_ones(1, shape, acc, dev) : NULL;
    mt_set_grad_enabled(prev);
    l->momentum = 0.1;
    l->eps = 1e-5;
    l->training = true;
    if (!l->running_var) {
        mt_batch_norm2d_layer_free(l);
        return mt_api_exit_status(mt_last_status() ? (int)mt_last_status() : MT_ERR_INTERNAL);
    }
    return mt_api_exit_status(0);
}

mt_tensor *mt_batch_norm2d_layer_forward(mt_batch_norm2d_layer *l, mt_tensor *x) {
    static const char op[] = "mt_batch_norm2d_layer_forward";
    if (!l) {
        mt_error_set(MT_ERR_NULL, "%s: arg 1: layer is NULL", op);
        return NULL;
    }
    if (!x) return NULL;
    if (!l->running_mean) {
        mt_error_set(MT_ERR_STATE, "%s: arg 1: layer is not initialised (or was freed)", op);
        return NULL;
    }
    if (mt_ndim(x) != 4) {
        mt_error_set(MT_ERR_SHAPE, "%s: arg 2: expected a 4-d [N, C, H, W] input, got %d dims", op,
                     mt_ndim(x));
        return NULL;
    }
    mt_api_enter();
    return mt_api_exit(mt_batch_norm(x, l->running_mean, l->running_var, l->weight, l->bias,
                                     l->training, l->momentum, l->eps));
}

void mt_batch_norm2d_layer_free(mt_batch_norm2d_layer *l) {
    if (!l) return;
    mt_tensor_unref(l->weight);
    mt_tensor_unref(l->bias);
    mt_tensor_unref(l->running_mean);
    mt_tensor_unref(l->running_var);
    l->weight = l->bias = l->running_mean = l->running_var = NULL;
}

/* ---------------------------------------------------------------- layer norm */

int mt_layer_norm_layer_init(mt_layer_norm_layer *l, int ndim, const int64_t *shape, bool affine,
                             mt_dtype dt, mt_device dev) {
    static const char op[] = "mt_layer_norm_layer_init";
    if (!l) return mt_error_set(MT_ERR_NULL, "%s: arg 1: layer is NULL", op);
    memset(l, 0, sizeof *l);
    if (ndim < 1 || ndim > MT_MAX_DIMS)
        return mt_error_set(MT_ERR_INVALID,
                            "%s: arg 2: normalized shape needs 1 to %d dims, got %d", op,
                            MT_MAX_DIMS, ndim);
    if (!shape) return mt_error_set(MT_ERR_NULL, "%s: arg 3: normalized shape is NULL", op);
    for (int i = 0; i < ndim; i++)
        if (shape[i] <= 0)
            return mt_error_set(MT_ERR_INVALID, "%s: arg 3: size %lld of dim %d is not positive",
                                op, (long long)shape[i], i);
    if (check_dtype(op, 5, dt) < 0) return (int)mt_last_status();
    l->ndim = ndim;
    memcpy(l->shape, shape, (size_t)ndim * sizeof *shape);
    l->eps = 1e-5;
    if (!affine) return 0;
    mt_api_enter();
    bool prev = mt_set_grad_enabled(false);
    l->weight = norm_param(ndim, shape, 1.0, dt, dev);
    l->bias = l->weight ? norm_param(ndim, shape, 0.0, dt, dev) : NULL;
    mt_set_grad_enabled(prev);
    if (!l->bias) {
        mt_layer_norm_layer_free(l);
        return mt_api_exit_status(mt_last_status() ? (int)mt_last_status() : MT_ERR_INTERNAL);
    }
    return mt_api_exit_status(0);
}

mt_tensor *mt_layer_norm_layer_forward(mt_layer_norm_layer *l, mt_tensor *x) {
    static const char op[] = "mt_layer_norm_layer_forward";
    if (!l) {
        mt_error_set(MT_ERR_NULL, "%s: arg 1: layer is NULL", op);
        return NULL;
    }
    if (!x) return NULL;
    if (l->ndim < 1 || l->ndim > MT_MAX_DIMS) {
        mt_error_set(MT_ERR_STATE, "%s: arg 1: layer is not initialised (or was freed)", op);
        return NULL;
    }
    /* without weight and bias the op cannot see the normalised shape: check it here */
    bool ok = mt_ndim(x) >= l->ndim;
    for (int i = 0; ok && i < l->ndim; i++) ok = mt_dim(x, mt_ndim(x) - l->ndim + i) == l->shape[i];
    if (!ok) {
        char want[MT_SHAPE_BUF], got[MT_SHAPE_BUF];
        mt_error_set(MT_ERR_SHAPE, "%s: arg 2: input %s does not end with the normalized shape %s",
                     op, mt_shape_str(x, got, sizeof got),
                     mt_dims_str(l->ndim, l->shape, want, sizeof want));
        return NULL;
    }
    mt_api_enter();
    return mt_api_exit(mt_layer_norm(x, l->ndim, l->weight, l->bias, l->eps));
}

void mt_layer_norm_layer_free(mt_layer_norm_layer *l) {
    if (!l) return;
    mt_tensor_unref(l->weight);
    mt_tensor_unref(l->bias);
    l->weight = l->bias = NULL;
    l->ndim = 0;
}
