/* Dtype, device and layout copies: cast, to, clone, contiguous, detach. Cast is a recorded
   op, so gradients flow back to an FP32 parameter in FP32 through autocast. */
#include "dispatch.h"

static int cast_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    gi[0] = mt_cast(g, n->inputs[0].dtype);
    return gi[0] ? 0 : mt_backward_failed();
}

static int to_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    mt_device dev = {(int)n->ints[0], (int)n->ints[1]};
    gi[0] = mt_to(g, dev);
    return gi[0] ? 0 : mt_backward_failed();
}

static int identity_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    (void)n;
    gi[0] = mt_tensor_ref(g);
    return 0;
}

/* A copy of t in dtype dt on dev (contiguous, or channels-last as below), recorded as op with
   backward fn. */
static mt_tensor *copy_as(mt_op_id op, mt_tensor *t, mt_dtype dt, mt_device dev,
                          mt_backward_fn bw) {
    const char *name = mt_op_fullname(op);
    /* cast, to and clone keep a channels-last layout (torch's preserve_format), so that an
       autocast cast feeds convolutions their NHWC path; contiguous asks for NCHW */
    bool same = dev.type == t->device.type && dev.index == t->device.index;
    bool cl = op != MT_OP_CONTIGUOUS && t->ndim == 4 && mt_prefers_channels_last(t);
    mt_tensor *out = cl ? mt_tensor_new_format(name, t->shape, dt, dev, true)
                        : mt_tensor_new(name, t->ndim, t->shape, dt, dev);
    if (!out) return NULL;
    int rc;
    if (same) {
        rc = mt_backend_get(dev)->copy(out, t);
    } else if (t->device.type == MT_DEVICE_CPU) { /* host -> device */
        /* upload takes the elements in logical (contiguous) order, whatever out's layout: a
           channels-last staging copy was read as NCHW */
        mt_tensor *src = mt_is_contiguous(t) && t->dtype == dt
                             ? mt_tensor_ref(t)
                             : copy_as(MT_OP_CONTIGUOUS, t, dt, MT_CPU, NULL);
        rc = src ? mt_backend_get(dev)->upload(out, mt_tensor_data(src)) : MT_ERR_OOM;
        mt_tensor_unref(src);
    } else if (dev.type == MT_DEVICE_CPU) { /* device -> host */
        mt_tensor *host = mt_tensor_new(name, t->ndim, t->shape, t->dtype, MT_CPU);
        rc = host ? mt_backend_get(t->device)->download(t, mt_tensor_data(host)) : MT_ERR_OOM;
        if (rc == 0) rc = mt_cpu_backend.copy(out, host);
        mt_tensor_unref(host);
    } else { /* device -> device of one backend: peer to peer, no host round trip */
        mt_tensor *src =
            t->dtype == dt ? mt_tensor_ref(t) : copy_as(MT_OP_CONTIGUOUS, t, dt, t->device, NULL);
        rc = src ? mt_backend_get(dev)->copy_peer(out, src) : MT_ERR_OOM;
        mt_tensor_unref(src);
    }
    if (rc == 0 && bw) {
        mt_node *node = mt_record(op, bw, &t, 1, out, &rc);
        if (node) {
            node->ints[0] = t->device.type;
            node->ints[1] = t->device.index;
        }
    }
    if (rc) {
        mt_tensor_unref(out);
        return NULL;
    }
    return out;
}

mt_tensor *mt_cast(mt_tensor *t, mt_dtype dt) {
    if (!t) return NULL;
    mt_api_enter();
    if ((unsigned)dt >= MT_DTYPE_COUNT) {
        mt_error_set(MT_ERR_DTYPE, "mt_cast: arg 2: invalid dtype %d", (int)dt);
        return mt_api_exit(NULL);
    }
    if (t->dtype == dt) return mt_api_exit(mt_tensor_ref(t));
    bool differentiable = mt_dtype_is_floating(dt) && mt_dtype_is_floating(t->dtype);
    mt_tensor *out = copy_as(MT_OP_CAST, t, dt, t->device, differentiable ? cast_backward : NULL);
    mt_dispatch_done(MT_OP_CAST, dt, out, &t, 1);
    return mt_api_exit(out);
}

mt_tensor *mt_to(mt_tensor *t, mt_device dev) {
    if (!t) return NULL;
    mt_api_enter();
    if (t->device.type == dev.type && t->device.index == dev.index)
        return mt_api_exit(mt_tensor_ref(t));
    if (!mt_backend_for("mt_to", dev)) return mt_api_exit(NULL);
    mt_tensor *out = copy_as(MT_OP_TO, t, t->dtype, dev, to_backward);
    return mt_api_exit(out);
}

mt_tensor *mt_clone(mt_tensor *t) {
    if (!t) return NULL;
    mt_api_enter();
    return mt_api_exit(copy_as(MT_OP_CLONE, t, t->dtype, t->device, identity_backward));
}

mt_tensor *mt_contiguous(mt_tensor *t) {
    if (!t) return NULL;
    mt_api_enter();
    if (mt_is_contiguous(t)) return mt_api_exit(mt_tensor_ref(t));
    return mt_api_exit(copy_as(MT_OP_CONTIGUOUS, t, t->dtype, t->device, identity_backward));
}

mt_tensor *mt_detach(mt_tensor *t) {
    if (!t) return NULL;
    mt_api_enter();
    return mt_api_exit(mt_tensor_alias(t));
}
