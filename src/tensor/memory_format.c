/* Memory formats of 4-d tensors: NCHW logical shape with either row-major (contiguous) or
   NHWC (channels-last) strides, like torch.memory_format. */
#include "tensor_impl.h"
#include "../math/dense_layout.h"

void mt_channels_last_strides(const int64_t *shape, int64_t *strides) {
    strides[1] = 1;
    strides[3] = shape[1];
    strides[2] = shape[3] * shape[1];
    strides[0] = shape[2] * shape[3] * shape[1];
}

/* torch's is_contiguous(memory_format=torch.channels_last): the strides of C, W, H, N in that
   order grow as a dense NHWC block, size-1 dims being free. */
bool mt_is_channels_last(const mt_tensor *t) {
    if (!t || t->ndim != 4) return false;
    static const int order[4] = {1, 3, 2, 0};
    int64_t expect = 1;
    for (int k = 0; k < 4; k++) {
        int d = order[k];
        if (t->shape[d] == 1) continue;
        if (t->strides[d] != expect) return false;
        expect *= t->shape[d];
    }
    return true;
}

bool mt_prefers_channels_last(const mt_tensor *t) {
    /* a tensor that is both (size-1 channels or spatial dims) stays NCHW, as torch's
       suggest_memory_format decides */
    return mt_is_channels_last(t) && !mt_is_contiguous(t);
}

/* base (fresh, owned; NULL after a failed allocation) seen with `shape` and `strides`, which
   cover its elements once. */
static mt_tensor *view_fresh(const char *op, mt_tensor *base, int ndim, const int64_t *shape,
                             const int64_t *strides) {
    if (!base) return NULL;
    mt_tensor *out = mt_tensor_view_of(base, ndim, shape, strides, base->offset);
    mt_tensor_unref(base);
    if (!out) mt_error_set(MT_ERR_OOM, "%s: out of memory for a tensor header", op);
    return out;
}

mt_tensor *mt_tensor_new_format(const char *op, const int64_t *shape, mt_dtype dt, mt_device dev,
                                bool channels_last) {
    if (!channels_last) return mt_tensor_new(op, 4, shape, dt, dev);
    const int64_t nhwc[4] = {shape[0], shape[2], shape[3], shape[1]};
    int64_t strides[4];
    mt_channels_last_strides(shape, strides);
    return view_fresh(op, mt_tensor_new(op, 4, nhwc, dt, dev), 4, shape, strides);
}

_Static_assert(MT_MAX_DIMS <= 16, "mt_dims_dense sorts at most 16 dims");

bool mt_is_dense(const mt_tensor *t) {
    return mt_dims_dense(t->ndim, t->shape, t->strides);
}

bool mt_same_strides(const mt_tensor *a, const mt_tensor *b) {
    return mt_same_shape(a, b) && mt_dims_same_strides(a->ndim, a->shape, a->strides, b->strides);
}

mt_tensor *mt_tensor_new_layout_of(const char *op, const mt_tensor *like, mt_dtype dt,
                                   mt_device dev) {
    if (mt_is_contiguous(like) || !mt_is_dense(like))
        return mt_tensor_new(op, like->ndim, like->shape, dt, dev);
    return view_fresh(op, mt_tensor_new(op, 1, &like->numel, dt, dev), like->ndim, like->shape,
                      like->strides);
}

mt_tensor *mt_tensor_new_like(const char *op, int ndim, const int64_t *shape, mt_dtype dt,
                              mt_device dev, const mt_tensor *const *like, int n) {
    bool cl = false;
    for (int i = 0; ndim == 4 && i < n; i++) {
        const mt_tensor *t = like[i];
        if (!t || t->ndim != 4 || t->shape[0] != shape[0] || t->shape[1] != shape[1] ||
            t->shape[2] != shape[2] || t->shape[3] != shape[3])
            continue;
        cl = mt_prefers_channels_last(t);
        break;
    }
    return cl ? mt_tensor_new_format(op, shape, dt, dev, true)
              : mt_tensor_new(op, ndim, shape, dt, dev);
}
