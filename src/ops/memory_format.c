/* mt_to_channels_last: a copy of a 4-d tensor with NHWC strides under its NCHW shape (torch's
   x.to(memory_format=torch.channels_last)). The gradient passes through unchanged: the copy
   changes the layout, never a value. */
#include "memory_format.h"

static int identity_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    (void)n;
    gi[0] = mt_tensor_ref(g);
    return 0;
}

static mt_tensor *to_channels_last_impl(mt_tensor *t) {
    const char *name = "mt_to_channels_last";
    char b[MT_SHAPE_BUF];
    if (t->ndim != 4) {
        mt_error_set(MT_ERR_SHAPE, "%s: arg 1: expected a 4-d tensor [N, C, H, W], got shape %s",
                     name, mt_shape_str(t, b, sizeof b));
        return NULL;
    }
    if (mt_is_channels_last(t)) return mt_tensor_ref(t);
    const mt_backend *be = mt_backend_for(name, t->device);
    if (!be) return NULL;
    mt_tensor *out = mt_tensor_new_format(name, t->shape, t->dtype, t->device, true);
    int rc = out ? be->copy(out, t) : mt_backward_failed();
    if (rc == 0) mt_record(MT_OP_TO_CHANNELS_LAST, identity_backward, &t, 1, out, &rc);
    if (rc) {
        mt_tensor_unref(out);
        return NULL;
    }
    mt_dispatch_done(MT_OP_TO_CHANNELS_LAST, t->dtype, out, &t, 1);
    return out;
}

mt_tensor *mt_to_channels_last(mt_tensor *t) {
    if (!t) return NULL;
    mt_api_enter();
    return mt_api_exit(to_channels_last_impl(t));
}

mt_tensor *mt_dense_4d(const char *op, mt_tensor *t, bool channels_last) {
    if (mt_is_contiguous(t) || mt_is_channels_last(t)) return mt_tensor_ref(t);
    mt_tensor *out = mt_tensor_new_format(op, t->shape, t->dtype, t->device, channels_last);
    if (out && mt_backend_get(t->device)->copy(out, t)) {
        mt_tensor_unref(out);
        return NULL;
    }
    return out;
}
