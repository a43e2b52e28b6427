/* 2-d pooling with torch's semantics: mt_max_pool2d, mt_avg_pool2d (kernel, stride, padding,
   ceil_mode, count_include_pad) and mt_adaptive_avg_pool2d, on the backend's pooling
   families. The output keeps the input's memory format. Max pooling's node keeps the argmax
   indices of its forward (I32, the output's shape: 1/4 of the input's bytes at stride 2) where
   the backend writes them (max_pool_indices), so that the backward only scatters; only when a
   node is recorded, never under no-grad. Elsewhere it keeps the input, from which the backward
   finds each window's argmax again. The average poolings keep nothing but the geometry. */
#include <stdlib.h>
#include "memory_format.h"

static mt_op_id pool_op(mt_pool_kind k) {
    return k == MT_POOL_MAX   ? MT_OP_MAX_POOL2D
           : k == MT_POOL_AVG ? MT_OP_AVG_POOL2D
                              : MT_OP_ADAPTIVE_AVG_POOL2D;
}

/* torch's pooling_output_shape (dilation 1), 0 for an empty output. Written so that no step
   overflows for any kernel and stride (pad <= k / 2, so k - 2 * pad is in [0, k]; the
   input's extent fits in memory). */
static int64_t pooled_size(int64_t in, int64_t k, int64_t pad, int64_t stride, bool ceil_mode) {
    int64_t window = k - 2 * pad;
    if (window > in) /* ceil_mode keeps one window that overhangs by less than a stride */
        return ceil_mode && window - in <= stride - 1 && in + pad > 0 ? 1 : 0;
    int64_t num = in - window, out = num / stride + 1;
    if (ceil_mode && num % stride != 0) {
        out++; /* a last, partial window, unless it would start in the right padding */
        if ((out - 1) * stride >= in + pad) out--;
    }
    return out;
}

static int pool_geometry(const char *name, const mt_tensor *x, const mt_pool2d_opts *o,
                         mt_pool2d_params *p, int64_t *shape) {
    char bx[MT_SHAPE_BUF];
    if (!o)
        return mt_error_set(MT_ERR_NULL, "%s: arg 2: options are NULL (kernel is required)", name);
    for (int i = 0; i < 2; i++) {
        int64_t k = o->kernel[i], s = o->stride[i] ? o->stride[i] : k, pad = o->padding[i];
        if (k < 1 || s < 1 || pad < 0)
            return mt_error_set(MT_ERR_INVALID,
                                "%s: arg 2: kernel must be positive, stride positive (0: the "
                                "kernel) and padding non-negative, got kernel [%lld, %lld], "
                                "stride [%lld, %lld], padding [%lld, %lld]",
                                name, (long long)o->kernel[0], (long long)o->kernel[1],
                                (long long)o->stride[0], (long long)o->stride[1],
                                (long long)o->padding[0], (long long)o->padding[1]);
        if (pad > k / 2)
            return mt_error_set(MT_ERR_INVALID,
                                "%s: arg 2: padding [%lld, %lld] must be at most half the kernel "
                                "[%lld, %lld]",
                                name, (long long)o->padding[0], (long long)o->padding[1],
                                (long long)o->kernel[0], (long long)o->kernel[1]);
        p->kernel[i] = k;
        p->stride[i] = s;
        p->padding[i] = pad;
        shape[2 + i] = pooled_size(x->shape[2 + i], k, pad, s, o->ceil_mode);
        if (shape[2 + i] < 1)
            return mt_error_set(MT_ERR_SHAPE,
                                "%s: input %s is too small for kernel [%lld, %lld] with padding "
                                "[%lld, %lld]: the output would be empty",
                                name, mt_shape_str(x, bx, sizeof bx), (long long)o->kernel[0],
                                (long long)o->kernel[1], (long long)o->padding[0],
                                (long long)o->padding[1]);
    }
    return 0;
}

static int pool_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    const char *name = mt_op_fullname(n->op);
    const mt_pool2d_params *p = n->state;
    const mt_input_meta *mx = &n->inputs[0];
    bool cl = n->ints[0] != 0, by_index = n->ints[1] != 0;
    mt_tensor *gy = mt_dense_4d(name, g, cl);
    mt_tensor *gx = gy ? mt_tensor_new_format(name, mx->shape, mx->dtype, g->device, cl) : NULL;
    const mt_tensor *x = by_index ? NULL : n->saved[0], *idx = by_index ? n->saved[0] : NULL;
    int rc =
        gx ? mt_backend_get(g->device)->pool2d_backward(gx, gy, x, idx, p) : mt_backward_failed();
    mt_tensor_unref(gy);
    if (rc)
        mt_tensor_unref(gx);
    else
        gi[0] = gx;
    return rc;
}

/* The shared path: validation of x, kernel, node. p and shape[2..3] are filled by the
   caller's geometry. */
static mt_tensor *pool_run(mt_tensor *x, mt_pool2d_params *p, int64_t *shape) {
    mt_op_id op = pool_op(p->kind);
    const char *name = mt_op_fullname(op);
    const mt_backend *be = mt_backend_for(name, x->device);
    if (!be) return NULL;
    mt_tensor *c;
    int compute = mt_dispatch_inputs(op, &x, 1, &c);
    if (compute < 0) return NULL;
    mt_tensor *d = mt_dense_4d(name, c, false);
    bool cl = d && mt_prefers_channels_last(d);
    mt_tensor *out = d ? mt_tensor_new_format(name, shape, d->dtype, d->device, cl) : NULL;
    /* the indices only when the node below will be recorded */
    bool by_index = p->kind == MT_POOL_MAX && be->max_pool_indices && mt_autograd_wanted(&c, 1);
    mt_tensor *idx =
        out && by_index ? mt_tensor_new_format(name, shape, MT_I32, d->device, cl) : NULL;
    int rc = out && (idx || !by_index) ? be->pool2d(out, idx, d, p) : mt_backward_failed();
    if (rc == 0) {
        mt_node *node = mt_record(op, pool_backward, &c, 1, out, &rc);
        if (node) rc = mt_node_copy_state(node, p, sizeof *p, name);
        if (node && rc == 0) {
            node->ints[0] = cl;
            node->ints[1] = by_index;
            node->n_ints = 2;
            if (p->kind == MT_POOL_MAX) rc = mt_node_save(node, 0, by_index ? idx : d);
        }
    }
    mt_tensor_unref(idx);
    if (rc) {
        mt_tensor_unref(out);
        out = NULL;
    }
    mt_dispatch_done(op, (mt_dtype)compute, out, &x, 1);
    mt_tensor_unref(d);
    mt_tensor_unref(c);
    return out;
}

static int check_input(const char *name, const mt_tensor *x, int64_t *shape) {
    char bx[MT_SHAPE_BUF];
    if (mt_check_floating(name, 1, x) < 0) return -1;
    if (x->ndim != 4 || x->shape[2] < 1 || x->shape[3] < 1)
        return mt_error_set(MT_ERR_SHAPE,
                            "%s: arg 1: input must be 4-d [N, C, H, W] with H, W >= 1, got shape "
                            "%s",
                            name, mt_shape_str(x, bx, sizeof bx));
    shape[0] = x->shape[0];
    shape[1] = x->shape[1];
    return 0;
}

static mt_tensor *window_pool(mt_pool_kind kind, mt_tensor *x, const mt_pool2d_opts *o) {
    const char *name = mt_op_fullname(pool_op(kind));
    mt_pool2d_params p = {.kind = kind, .count_include_pad = !(o && o->exclude_pad)};
    int64_t shape[4];
    if (check_input(name, x, shape) < 0 || pool_geometry(name, x, o, &p, shape) < 0) return NULL;
    if (kind == MT_POOL_MAX && o->exclude_pad)
        return mt_error_set(MT_ERR_INVALID, "%s: arg 2: exclude_pad is for average pooling", name),
               NULL;
    return pool_run(x, &p, shape);
}

mt_tensor *mt_max_pool2d(mt_tensor *x, const mt_pool2d_opts *o) {
    if (!x) return NULL;
    mt_api_enter();
    return mt_api_exit(window_pool(MT_POOL_MAX, x, o));
}

mt_tensor *mt_avg_pool2d(mt_tensor *x, const mt_pool2d_opts *o) {
    if (!x) return NULL;
    mt_api_enter();
    return mt_api_exit(window_pool(MT_POOL_AVG, x, o));
}

static mt_tensor *adaptive_impl(mt_tensor *x, int64_t oh, int64_t ow) {
    const char *name = "mt_adaptive_avg_pool2d";
    mt_pool2d_params p = {.kind = MT_POOL_ADAPTIVE_AVG};
    int64_t shape[4] = {0, 0, oh, ow};
    if (check_input(name, x, shape) < 0) return NULL;
    if (oh < 1 || ow < 1) {
        mt_error_set(MT_ERR_INVALID, "%s: output size [%lld, %lld] must be positive", name,
                     (long long)oh, (long long)ow);
        return NULL;
    }
    return pool_run(x, &p, shape);
}

mt_tensor *mt_adaptive_avg_pool2d(mt_tensor *x, int64_t out_h, int64_t out_w) {
    if (!x) return NULL;
    mt_api_enter();
    return mt_api_exit(adaptive_impl(x, out_h, out_w));
}
