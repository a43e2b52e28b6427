/* 2-d convolution layer: y = conv2d(x, W) + b with W [out, in / groups, kH, kW], initialised
   like torch.nn.Conv2d. */
#include <math.h>
#include "init.h"

int mt_conv2d_layer_init(mt_conv2d_layer *l, int64_t in, int64_t out, int64_t kh, int64_t kw,
                         const mt_conv2d_opts *opts, bool bias, mt_dtype dt, mt_device dev) {
    const char *name = "mt_conv2d_layer_init";
    if (!l) return mt_error_set(MT_ERR_NULL, "%s: arg 1: layer is NULL", name);
    l->weight = l->bias = NULL;
    l->opts = opts ? *opts : (mt_conv2d_opts){0};
    int64_t g = l->opts.groups ? l->opts.groups : 1;
    if (in <= 0 || out <= 0 || kh <= 0 || kw <= 0)
        return mt_error_set(MT_ERR_INVALID,
                            "%s: channels and kernel sizes must be positive, got in %lld, out "
                            "%lld, kernel [%lld, %lld]",
                            name, (long long)in, (long long)out, (long long)kh, (long long)kw);
    if (g < 0 || in % g || out % g)
        return mt_error_set(MT_ERR_INVALID,
                            "%s: groups %lld must be positive and divide in %lld and out %lld",
                            name, (long long)g, (long long)in, (long long)out);
    if (!mt_dtype_is_floating(dt))
        return mt_error_set(MT_ERR_DTYPE, "%s: arg 8: parameters must be floating, got %s", name,
                            mt_dtype_name(dt));
    mt_api_enter();
    bool prev = mt_set_grad_enabled(false);
    /* torch.nn.Conv2d: kaiming_uniform(a = sqrt(5)) of W and the bias init both reduce to
       U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in / groups * kH * kW */
    double bound = 1.0 / sqrt((double)(in / g) * (double)kh * (double)kw); /* no int64 overflow */
    l->weight = mt_nn_uniform_param(4, (const int64_t[]){out, in / g, kh, kw}, bound, dt, dev);
    if (l->weight && bias) l->bias = mt_nn_uniform_param(1, &out, bound, dt, dev);
    mt_set_grad_enabled(prev);
    if (!l->weight || (bias && !l->bias)) {
        mt_conv2d_layer_free(l);
        return mt_api_exit_status(mt_last_status() ? (int)mt_last_status() : MT_ERR_INTERNAL);
    }
    return mt_api_exit_status(0);
}

mt_tensor *mt_conv2d_layer_forward(mt_conv2d_layer *l, mt_tensor *x) {
    if (!l) {
        mt_error_set(MT_ERR_NULL, "mt_conv2d_layer_forward: arg 1: layer is NULL");
        return NULL;
    }
    if (!x) return NULL;
    if (!l->weight) {
        mt_error_set(MT_ERR_STATE,
                     "mt_conv2d_layer_forward: arg 1: layer is not initialised (or was freed)");
        return NULL;
    }
    mt_api_enter(); /* errors inside read "mt_conv2d_layer_forward: mt_conv2d: ..." */
    return mt_api_exit(mt_conv2d(x, l->weight, l->bias, &l->opts));
}

void mt_conv2d_layer_free(mt_conv2d_layer *l) {
    if (!l) return;
    mt_tensor_unref(l->weight);
    mt_tensor_unref(l->bias);
    l->weight = l->bias = NULL;
}
