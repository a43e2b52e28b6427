/* Argument checks shared by op entry points; each names the op and the argument. */
#include "tensor_impl.h"

int mt_check_floating(const char *op, int arg, const mt_tensor *t) {
    if (mt_dtype_is_floating(t->dtype)) return 0;
    return mt_error_set(MT_ERR_DTYPE,
                        "%s: arg %d: dtype %s is not a floating dtype (f32, f64, f16, bf16)", op,
                        arg, mt_dtype_name(t->dtype));
}

int mt_check_same_device(const char *op, const mt_tensor *a, const mt_tensor *b) {
    if (a->device.type == b->device.type && a->device.index == b->device.index) return 0;
    return mt_error_set(MT_ERR_DEVICE, "%s: tensors are on different devices (%s:%d and %s:%d)", op,
                        a->device.type == MT_DEVICE_CUDA ? "cuda" : "cpu", a->device.index,
                        b->device.type == MT_DEVICE_CUDA ? "cuda" : "cpu", b->device.index);
}

mt_dtype mt_promote_floating(mt_dtype a, mt_dtype b) {
    if (a == b) return a;
    if (a == MT_F64 || b == MT_F64) return MT_F64;
    if (!mt_dtype_is_floating(a)) return b;
    if (!mt_dtype_is_floating(b)) return a;
    return MT_F32; /* f32 with anything lower, or f16 with bf16 */
}
