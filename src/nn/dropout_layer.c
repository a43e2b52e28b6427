/* Dropout layer like torch.nn.Dropout, with a `training` flag per layer (no global mode). */
#include "../tensor/tensor_impl.h"

int mt_dropout_layer_init(mt_dropout_layer *l, double p) {
    if (!l) return mt_error_set(MT_ERR_NULL, "mt_dropout_layer_init: arg 1: layer is NULL");
    if (!(p >= 0 && p <= 1))
        return mt_error_set(MT_ERR_INVALID, "mt_dropout_layer_init: arg 2: p %g must be in [0, 1]",
                            p);
    l->p = p;
    l->training = true;
    return 0;
}

mt_tensor *mt_dropout_layer_forward(mt_dropout_layer *l, mt_tensor *x) {
    if (!l) {
        mt_error_set(MT_ERR_NULL, "mt_dropout_layer_forward: arg 1: layer is NULL");
        return NULL;
    }
    mt_api_enter();
    return mt_api_exit(mt_dropout(x, l->p, l->training));
}
