/* Argument checks shared by op entry points; each names the op and the argument. */
#include <math.h>
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

int mt_check_no_self_overlap(const char *op, int arg, const mt_tensor *t) {
    for (int i = 0; i < t->ndim; i++)
        if (t->strides[i] == 0 && t->shape[i] > 1) {
            char b1[MT_SHAPE_BUF], b2[MT_SHAPE_BUF];
            return mt_error_set(MT_ERR_INVALID,
                                "%s: arg %d: tensor of shape %s and strides %s has elements that "
                                "share memory (an expanded view); write to a contiguous copy",
                                op, arg, mt_shape_str(t, b1, sizeof b1),
                                mt_dims_str(t->ndim, t->strides, b2, sizeof b2));
        }
    return 0;
}

mt_dtype mt_promote_floating(mt_dtype a, mt_dtype b) {
    if (a == b) return a;
    if (a == MT_F64 || b == MT_F64) return MT_F64;
    if (!mt_dtype_is_floating(a)) return b;
    if (!mt_dtype_is_floating(b)) return a;
    return MT_F32; /* f32 with anything lower, or f16 with bf16 */
}

/* The largest finite value of a floating dtype (F64: any double fits). */
static double max_finite(mt_dtype dt) {
    return dt == MT_F16    ? 65504.0
           : dt == MT_BF16 ? 3.3895313892515355e38
           : dt == MT_F32  ? 3.4028234663852886e38
                           : INFINITY;
}

int mt_check_fill_value(const char *op, int arg, mt_dtype dt, double v) {
    /* as torch's c10::overflows: the value itself, before rounding or truncation, within the
       range; a floating dtype takes inf and NaN as they are */
    bool fits = dt == MT_I32   ? v >= -2147483648.0 && v <= 2147483647.0
                : dt == MT_I64 ? v >= -9223372036854775808.0 && v < 9223372036854775808.0
                : mt_dtype_is_floating(dt) ? !isfinite(v) || fabs(v) <= max_finite(dt)
                                           : true;
    if (fits) return 0;
    return mt_error_set(MT_ERR_INVALID, "%s: arg %d: value %g does not fit in %s", op, arg, v,
                        mt_dtype_name(dt));
}
