/* Linear layer: y = act(x W^T + b) with W [out, in], initialised like torch.nn.Linear. */
#include <math.h>
#include "init.h"
#include "../io/state_impl.h"

int mt_linear_layer_init(mt_linear_layer *l, int64_t in, int64_t out, bool bias, mt_dtype dt,
                         mt_device dev) {
    if (!l) return mt_error_set(MT_ERR_NULL, "mt_linear_layer_init: arg 1: layer is NULL");
    l->weight = l->bias = NULL;
    l->act = MT_ACT_NONE;
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
    mt_api_enter();
    return mt_api_exit(l->act == MT_ACT_NONE ? mt_linear(x, l->weight, l->bias)
                                             : mt_linear_act(x, l->weight, l->bias, l->act));
}

void mt_linear_layer_free(mt_linear_layer *l) {
    if (!l) return;
    mt_tensor_unref(l->weight);
    mt_tensor_unref(l->bias);
    l->weight = l->bias = NULL;
}

/* "<prefix>weight" and "<prefix>bias": torch.nn.Linear's state dict names. */
int mt_linear_layer_state_put(mt_linear_layer *l, mt_state *s, const char *prefix) {
    static const char fn[] = "mt_linear_layer_state_put";
    if (!l) return mt_error_set(MT_ERR_NULL, "%s: arg 1: layer is NULL", fn);
    if (!l->weight) return mt_error_set(MT_ERR_STATE, "%s: arg 1: layer is not initialised", fn);
    if (!s) return mt_error_set(MT_ERR_NULL, "%s: arg 2: state is NULL", fn);
    if (!prefix) prefix = "";
    char key[512];
    if (snprintf(key, sizeof key, "%sweight", prefix) >= (int)sizeof key)
        return mt_error_set(MT_ERR_INVALID, "%s: arg 3: prefix is too long", fn);
    /* into a fresh state first, merged at the end: a failed put leaves s as it was */
    mt_state *fresh = mt_state_new();
    int rc = fresh ? mt_state_put(fresh, key, l->weight) : (int)mt_last_status();
    if (rc == 0 && l->bias) {
        snprintf(key, sizeof key, "%sbias", prefix);
        rc = mt_state_put(fresh, key, l->bias);
    }
    if (rc == 0) rc = mt_state_merge(s, fresh, fn);
    mt_state_free(fresh);
    return rc;
}

int mt_linear_layer_state_load(mt_linear_layer *l, mt_state *s, const char *prefix, bool strict) {
    static const char fn[] = "mt_linear_layer_state_load";
    if (!l) return mt_error_set(MT_ERR_NULL, "%s: arg 1: layer is NULL", fn);
    if (!l->weight) return mt_error_set(MT_ERR_STATE, "%s: arg 1: layer is not initialised", fn);
    mt_tensor *params[2] = {l->weight, l->bias};
    const char *names[2] = {"weight", "bias"};
    mt_api_enter_at(fn); /* errors inside read "mt_linear_layer_state_load: ..." */
    return mt_api_exit_status(
        mt_state_load_into(s, prefix, params, names, l->bias ? 2 : 1, strict));
}
