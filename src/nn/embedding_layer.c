/* Embedding layer like torch.nn.Embedding: weight drawn from N(0, 1). */
#include "../tensor/tensor_impl.h"

int mt_embedding_layer_init(mt_embedding_layer *l, int64_t num, int64_t dim, mt_dtype dt,
                            mt_device dev) {
    static const char op[] = "mt_embedding_layer_init";
    if (!l) return mt_error_set(MT_ERR_NULL, "%s: arg 1: layer is NULL", op);
    l->weight = NULL;
    if (num <= 0 || dim <= 0)
        return mt_error_set(MT_ERR_INVALID,
                            "%s: num_embeddings and dim must be positive, got %lld and %lld", op,
                            (long long)num, (long long)dim);
    if (!mt_dtype_is_floating(dt))
        return mt_error_set(MT_ERR_DTYPE, "%s: arg 4: parameters must be floating, got %s", op,
                            mt_dtype_name(dt));
    mt_api_enter();
    bool prev = mt_set_grad_enabled(false);
    /* drawn in FP32 (F64 for F64) and rounded once, like the linear layer's init */
    mt_tensor *n = mt_randn(2, (const int64_t[]){num, dim}, dt == MT_F64 ? MT_F64 : MT_F32, dev);
    l->weight = n ? mt_cast(n, dt) : NULL;
    mt_tensor_unref(n);
    mt_set_grad_enabled(prev);
    if (!l->weight)
        return mt_api_exit_status(mt_last_status() ? (int)mt_last_status() : MT_ERR_INTERNAL);
    mt_set_requires_grad(l->weight, true);
    return mt_api_exit_status(0);
}

mt_tensor *mt_embedding_layer_forward(mt_embedding_layer *l, mt_tensor *indices) {
    if (!l) {
        mt_error_set(MT_ERR_NULL, "mt_embedding_layer_forward: arg 1: layer is NULL");
        return NULL;
    }
    if (!indices) return NULL;
    if (!l->weight) {
        mt_error_set(MT_ERR_STATE,
                     "mt_embedding_layer_forward: arg 1: layer is not initialised (or was freed)");
        return NULL;
    }
    mt_api_enter();
    return mt_api_exit(mt_embedding(l->weight, indices));
}

void mt_embedding_layer_free(mt_embedding_layer *l) {
    if (!l) return;
    mt_tensor_unref(l->weight);
    l->weight = NULL;
}
