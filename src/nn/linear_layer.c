/* Linear layer: y = x W^T + b with W [out, in], initialised like torch.nn.Linear. */
#include <math.h>
#include "init.h"

int mt_linear_layer_init(mt_linear_layer *l, int64_t in, int64_t out, bool bias, mt_dtype dt,
                         mt_device dev) {
    if (!l) return mt_error_set(MT_ERR_NULL, "mt_linear_layer_init: arg 1: layer is NULL");
    l->weight = l->bias = NULL;
    if (in <= 0 || out <= 0)
        return mt_error_set(MT_ERR_INVALID,
                            "mt_linear_layer_init: in_features and out_features must be "
                            "positive, got in %lld, out %lld",
                            (long long)in, (long long)out);
    if (!mt_dtype_is_floating(dt))
        return mt_error_set(MT_ERR_DTYPE,
                            "mt_linear_layer_init: arg 5: parameters must be floating, got %s",
                            mt_dtype_name(dt));
    mt_api_enter();
    bool prev = mt_set_grad_enabled(false);
    /* kaiming_uniform(a = sqrt(5)) of W and torch's bias init both reduce to
       U(-1/sqrt(in), 1/sqrt(in)) */
    double bound = 1.0 / sqrt((double)in);
    l->weight = mt_nn_uniform_param(2, (const int64_t[]){out, in}, bound, dt, dev);
    if (l->weight && bias) l->bias = mt_nn_uniform_param(1, (const int64_t[]){out}, bound, dt, dev);
    mt_set_grad_enabled(prev);
    if (!l->weight || (bias && !l->bias)) {
        mt_linear_layer_free(l);
        return mt_api_exit_status(mt_last_status() ? (int)mt_last_status() : MT_ERR_INTERNAL);
    }
    return mt_api_exit_status(0);
}

mt_tensor *mt_linear_layer_forward(mt_linear_layer *l, mt_tensor *x) {
    if (!l) {
        mt_error_set(MT_ERR_NULL, "mt_linear_layer_forward: arg 1: layer is NULL");
        return NULL;
    }
    if (!x) return NULL;
    if (!l->weight) {
        mt_error_set(MT_ERR_STATE,
                     "mt_linear_layer_forward: arg 1: layer is not initialised (or was freed)");
        return NULL;
    }
    return mt_linear(x, l->weight, l->bias);
}

void mt_linear_layer_free(mt_linear_layer *l) {
    if (!l) return;
    mt_release(l->weight);
    mt_release(l->bias);
    l->weight = l->bias = NULL;
}
