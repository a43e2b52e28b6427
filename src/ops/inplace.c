/* In-place ops: fill, zero, copy, add_inplace, mul_scalar_inplace. They are not recorded on
   the tape; each bumps the storage's version counter so that a backward which saved the old
   values reports the change instead of computing wrong gradients. Like torch, they refuse
   tensors that require grad while grad mode is on (modify parameters under
   mt_set_grad_enabled(false), or through mt_detach). */
#include "dispatch.h"

/* Refuses tensors that take part in autograd while grad mode is on. */
static int check_writable(const char *op, int arg, const mt_tensor *t) {
    if (!mt_grad_mode()) return 0;
    if (t->nograd_view_of_grad)
        return mt_error_set(MT_ERR_STATE,
                            "%s: arg %d: a view made with grad mode off of a tensor that requires "
                            "grad cannot be modified in place while grad mode is on (make the "
                            "view with grad mode on, or write with it off)",
                            op, arg);
    if (!t->requires_grad && t->view_base && t->view_base->requires_grad)
        return mt_error_set(MT_ERR_STATE,
                            "%s: arg %d: a view of a leaf tensor that requires grad (made before "
                            "it required grad) cannot be modified in place while grad mode is on "
                            "(use mt_set_grad_enabled(false) around the update)",
                            op, arg);
    if (!t->requires_grad) return 0;
    if (t->grad_fn)
        return mt_error_set(MT_ERR_STATE,
                            "%s: arg %d: a tensor made by mt_%s that requires grad cannot be "
                            "modified in place while grad mode is on (use mt_detach or "
                            "mt_set_grad_enabled(false))",
                            op, arg, mt_op_name(t->grad_fn->op));
    return mt_error_set(MT_ERR_STATE,
                        "%s: arg %d: a leaf tensor that requires grad cannot be modified in place "
                        "while grad mode is on (use mt_set_grad_enabled(false) around the update)",
                        op, arg);
}

/* src as a tensor readable while writing dst: expanded to dst's shape, on dst's device, and
   copied first when it shares dst's memory. New reference, or NULL with the error set. */
static mt_tensor *prepare_source(const char *op, mt_tensor *dst, mt_tensor *src, mt_dtype dt) {
    int nd;
    int64_t shape[MT_MAX_DIMS];
    char b1[MT_SHAPE_BUF], b2[MT_SHAPE_BUF];
    if (mt_broadcast_shapes(op, dst->ndim, dst->shape, src->ndim, src->shape, &nd, shape) < 0)
        return NULL;
    bool fits = nd == dst->ndim;
    for (int i = 0; fits && i < nd; i++) fits = shape[i] == dst->shape[i];
    if (!fits) {
        mt_error_set(MT_ERR_SHAPE,
                     "%s: arg 2: shape %s does not broadcast to the destination shape %s", op,
                     mt_shape_str(src, b1, sizeof b1), mt_shape_str(dst, b2, sizeof b2));
        return NULL;
    }
    bool prev = mt_set_grad_enabled(false); /* the temporaries below are not part of autograd */
    mt_tensor *s = mt_to(src, dst->device);
    if (s && s->dtype != dt) {
        mt_tensor *c = mt_cast(s, dt);
        mt_tensor_unref(s);
        s = c;
    }
    if (s && s->storage == dst->storage) { /* overlapping memory: read from a copy */
        mt_tensor *c = mt_clone(s);
        mt_tensor_unref(s);
        s = c;
    }
    mt_set_grad_enabled(prev);
    if (!s) return NULL;
    mt_tensor *e = mt_tensor_expand_to(s, dst->ndim, dst->shape);
    mt_tensor_unref(s);
    return e;
}

static int fill(mt_tensor *t, double value) {
    if (!t) return mt_error_set(MT_ERR_NULL, "mt_fill: arg 1: tensor is NULL");
    int rc = check_writable("mt_fill", 1, t);
    if (rc == 0) rc = mt_check_fill_value("mt_fill", 2, t->dtype, value);
    if (rc == 0) rc = mt_backend_get(t->device)->fill(t, value);
    if (rc == 0) mt_tensor_bump_version(t);
    return rc;
}

int mt_fill(mt_tensor *t, double value) {
    mt_api_enter(); /* errors inside read "mt_fill: ..." */
    return mt_api_exit_status(fill(t, value));
}

static int zero(mt_tensor *t) {
    if (!t) return mt_error_set(MT_ERR_NULL, "mt_zero: arg 1: tensor is NULL");
    int rc = check_writable("mt_zero", 1, t);
    if (rc == 0) rc = mt_backend_get(t->device)->fill(t, 0.0);
    if (rc == 0) mt_tensor_bump_version(t);
    return rc;
}

int mt_zero(mt_tensor *t) {
    mt_api_enter(); /* errors inside read "mt_zero: ..." */
    return mt_api_exit_status(zero(t));
}

int mt_copy(mt_tensor *dst, mt_tensor *src) {
    if (!dst) return mt_error_set(MT_ERR_NULL, "mt_copy: arg 1: dst is NULL");
    if (!src) return mt_error_set(MT_ERR_NULL, "mt_copy: arg 2: src is NULL");
    int rc = check_writable("mt_copy", 1, dst);
    if (rc == 0) rc = mt_check_no_self_overlap("mt_copy", 1, dst);
    if (rc) return rc;
    mt_api_enter();
    mt_tensor *s = prepare_source("mt_copy", dst, src, src->dtype);
    rc = s ? mt_tensor_overwrite(dst, s) : mt_backward_failed();
    mt_tensor_unref(s);
    return mt_api_exit_status(rc);
}

int mt_add_inplace(mt_tensor *a, mt_tensor *b) {
    if (!a) return mt_error_set(MT_ERR_NULL, "mt_add_inplace: arg 1: tensor is NULL");
    if (!b) return mt_error_set(MT_ERR_NULL, "mt_add_inplace: arg 2: tensor is NULL");
    const char *op = "mt_add_inplace";
    int rc = mt_check_floating(op, 1, a);
    if (rc == 0) rc = mt_check_floating(op, 2, b);
    /* a 0-d CPU source meets any destination, as in mt_add (prepare_source uploads it) */
    if (rc == 0 && !(b->ndim == 0 && b->device.type == MT_DEVICE_CPU))
        rc = mt_check_same_device(op, a, b);
    if (rc == 0) rc = check_writable(op, 1, a);
    if (rc == 0) rc = mt_check_no_self_overlap(op, 1, a);
    if (rc) return rc;
    mt_api_enter();
    /* a wider source: the sum in the wider dtype, rounded once into a (torch's add_), not
       the source rounded to a's dtype first (two roundings; F16 -60000 + 70000 was inf) */
    mt_dtype wide = mt_promote_floating(a->dtype, b->dtype);
    const mt_backend *be = mt_backend_get(a->device);
    mt_tensor *s = prepare_source(op, a, b, wide);
    mt_tensor *sum = !s                 ? NULL
                     : wide != a->dtype ? mt_tensor_new(op, a->ndim, a->shape, wide, a->device)
                                        : mt_tensor_ref(a);
    rc = sum ? 0 : mt_backward_failed();
    if (rc == 0 && sum != a) rc = be->copy(sum, a);
    if (rc == 0) rc = be->binary(MT_OP_ADD, sum, sum, s);
    if (rc == 0 && sum != a) rc = be->copy(a, sum);
    mt_tensor_unref(sum);
    mt_tensor_unref(s);
    if (rc == 0) mt_tensor_bump_version(a);
    return mt_api_exit_status(rc);
}

static int mul_scalar_inplace(mt_tensor *a, double s) {
    if (!a) return mt_error_set(MT_ERR_NULL, "mt_mul_scalar_inplace: arg 1: tensor is NULL");
    const char *op = "mt_mul_scalar_inplace";
    int rc = mt_check_floating(op, 1, a);
    if (rc == 0) rc = check_writable(op, 1, a);
    if (rc == 0) rc = mt_check_no_self_overlap(op, 1, a);
    if (rc == 0) rc = mt_backend_get(a->device)->unary(MT_OP_MUL_SCALAR, a, a, s);
    if (rc == 0) mt_tensor_bump_version(a);
    return rc;
}

int mt_mul_scalar_inplace(mt_tensor *a, double s) {
    mt_api_enter(); /* errors inside read "mt_mul_scalar_inplace: ..." */
    return mt_api_exit_status(mul_scalar_inplace(a, s));
}
