/* Views: reshape, view, flatten, transpose, permute, narrow, slice, expand, squeeze and
   unsqueeze. A view is a new header over its input's storage (so the version counter is
   shared and an in-place change through any alias is seen at backward); each records a node
   whose backward maps the gradient back to the input's layout. reshape copies when no
   strides fit (like torch.reshape) and records the same node either way. */
#include <string.h>
#include "dispatch.h"

/* ------------------------------------------------------------------ backward formulas */

/* reshape, view, squeeze, unsqueeze: the gradient takes the input's shape back. */
static int reshape_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    gi[0] = mt_reshape(g, n->inputs[0].ndim, n->inputs[0].shape);
    return gi[0] ? 0 : mt_backward_failed();
}

static int transpose_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    gi[0] = mt_transpose(g, (int)n->ints[0], (int)n->ints[1]);
    return gi[0] ? 0 : mt_backward_failed();
}

static int permute_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    int inv[MT_MAX_DIMS];
    for (int i = 0; i < n->n_ints; i++) inv[n->ints[i]] = i;
    gi[0] = mt_permute(g, n->n_ints, inv);
    return gi[0] ? 0 : mt_backward_failed();
}

/* Zeros of the input's shape with the gradient written into the sliced positions. */
static int slice_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    const mt_input_meta *m = &n->inputs[0];
    int dim = (int)n->ints[0];
    int64_t start = n->ints[1], step = n->ints[2];
    mt_tensor *z = mt_zeros(m->ndim, m->shape, g->dtype, g->device);
    if (!z) return mt_backward_failed();
    int64_t strides[MT_MAX_DIMS];
    memcpy(strides, z->strides, sizeof strides);
    if (g->shape[dim] > 1) strides[dim] *= step; /* as the forward: one element is never stepped */
    mt_tensor *v = mt_tensor_view_of(z, g->ndim, g->shape, strides, start * z->strides[dim]);
    int rc = v ? mt_backend_get(g->device)->copy(v, g) : MT_ERR_OOM;
    mt_tensor_unref(v);
    if (rc) {
        mt_tensor_unref(z);
        return rc;
    }
    gi[0] = z;
    return 0;
}

static int expand_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    gi[0] = mt_grad_reduce_to_input(n, 0, g);
    return gi[0] ? 0 : mt_backward_failed();
}

/* ------------------------------------------------------------------ shared path */

/* Records op on out (a view or copy of t) and stores ints for the backward; takes out. */
static mt_tensor *finish(mt_op_id op, mt_backward_fn bw, mt_tensor *t, mt_tensor *out,
                         const int64_t *ints, int n_ints) {
    if (!out) return NULL;
    int rc;
    mt_node *node = mt_record(op, bw, &t, 1, out, &rc);
    if (rc) {
        mt_tensor_unref(out);
        return NULL;
    }
    if (node) {
        for (int i = 0; i < n_ints; i++) node->ints[i] = ints[i];
        node->n_ints = n_ints;
    }
    if (!out->grad_fn && out->storage == t->storage) {
        out->nograd_view_of_grad = t->requires_grad || t->nograd_view_of_grad;
        /* only with grad mode on, where the check reads it: views made by the backward
           (grad mode off) would keep the gradients they alias from being adopted in place */
        if (mt_grad_mode()) out->view_base = mt_tensor_ref(t->view_base ? t->view_base : t);
    }
    mt_dispatch_done(op, t->dtype, out, &t, 1);
    return out;
}

/* Strides that let a tensor of (ndim, shape, strides) be seen as new_shape without a copy,
   or false when none exist (the algorithm of ATen's computeStride). */
static bool view_strides(const mt_tensor *t, int nd, const int64_t *ns, int64_t *out) {
    if (t->numel == 0 || t->numel == 1 || mt_is_contiguous(t)) {
        mt_contiguous_strides(nd, ns, out);
        return true;
    }
    int view_d = nd - 1;
    int64_t chunk_base = t->strides[t->ndim - 1], tensor_numel = 1, view_numel = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        tensor_numel *= t->shape[d];
        /* a chunk ends where the next outer dim is not laid out right after this one */
        if (d == 0 || (t->shape[d - 1] != 1 && t->strides[d - 1] != tensor_numel * chunk_base)) {
            while (view_d >= 0 && (view_numel < tensor_numel || ns[view_d] == 1)) {
                out[view_d] = view_numel * chunk_base;
                view_numel *= ns[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return false;
            if (d > 0) {
                chunk_base = t->strides[d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

/* Validates a requested shape (one -1 allowed) against t's element count and writes the
   resolved shape. */
static int resolve_shape(const char *op, const mt_tensor *t, int ndim, const int64_t *shape,
                         int64_t *out) {
    char b1[MT_SHAPE_BUF], b2[MT_SHAPE_BUF];
    if (ndim < 0 || ndim > MT_MAX_DIMS)
        return mt_error_set(MT_ERR_INVALID,
                            "%s: arg 2: %d dims requested, at most %d are supported", op, ndim,
                            MT_MAX_DIMS);
    if (ndim > 0 && !shape) return mt_error_set(MT_ERR_NULL, "%s: arg 3: shape is NULL", op);
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == -1) {
            if (infer >= 0)
                return mt_error_set(MT_ERR_INVALID,
                                    "%s: arg 3: only one dimension can be -1, got %s", op,
                                    mt_dims_str(ndim, shape, b1, sizeof b1));
            infer = i;
        } else if (shape[i] < 0) {
            return mt_error_set(MT_ERR_SHAPE, "%s: arg 3: invalid size %lld in shape %s", op,
                                (long long)shape[i], mt_dims_str(ndim, shape, b1, sizeof b1));
        } else if (__builtin_mul_overflow(known, shape[i], &known)) {
            return mt_error_set(MT_ERR_SHAPE, "%s: arg 3: shape %s has more than 2^63 elements", op,
                                mt_dims_str(ndim, shape, b1, sizeof b1));
        }
        out[i] = shape[i];
    }
    if (infer >= 0) {
        if (known == 0)
            return mt_error_set(MT_ERR_SHAPE,
                                "%s: arg 3: cannot infer the -1 in shape %s for a tensor of %lld "
                                "elements (the other sizes multiply to 0)",
                                op, mt_dims_str(ndim, shape, b1, sizeof b1), (long long)t->numel);
        if (t->numel % known == 0) {
            out[infer] = t->numel / known;
            known *= out[infer];
        }
    }
    if (known != t->numel)
        return mt_error_set(MT_ERR_SHAPE,
                            "%s: arg 3: shape %s is invalid for input of shape %s (%lld elements)",
                            op, mt_dims_str(ndim, shape, b1, sizeof b1),
                            mt_shape_str(t, b2, sizeof b2), (long long)t->numel);
    return known == 0 ? mt_shape_check_strides(op, ndim, out) : 0;
}

/* reshape (copy_ok) and view. */
static mt_tensor *reshape_impl(mt_op_id op, mt_tensor *t, int ndim, const int64_t *shape,
                               bool copy_ok) {
    const char *name = mt_op_fullname(op);
    int64_t ns[MT_MAX_DIMS], st[MT_MAX_DIMS];
    if (resolve_shape(name, t, ndim, shape, ns) < 0) return NULL;
    mt_tensor *out;
    if (view_strides(t, ndim, ns, st)) {
        out = mt_tensor_view_of(t, ndim, ns, st, t->offset);
    } else if (!copy_ok) {
        char b1[MT_SHAPE_BUF], b2[MT_SHAPE_BUF], b3[MT_SHAPE_BUF];
        mt_error_set(MT_ERR_SHAPE,
                     "%s: arg 1: a tensor of shape %s and strides %s cannot be viewed as %s "
                     "without a copy; use mt_reshape or mt_contiguous first",
                     name, mt_shape_str(t, b1, sizeof b1),
                     mt_dims_str(t->ndim, t->strides, b2, sizeof b2),
                     mt_dims_str(ndim, ns, b3, sizeof b3));
        return NULL;
    } else {
        /* a contiguous copy in the new shape: copy through a header in the old shape */
        out = mt_tensor_new(name, ndim, ns, t->dtype, t->device);
        if (!out) return NULL;
        int64_t cs[MT_MAX_DIMS];
        mt_contiguous_strides(t->ndim, t->shape, cs);
        mt_tensor *dst = mt_tensor_view_of(out, t->ndim, t->shape, cs, 0);
        int rc = dst ? mt_backend_get(t->device)->copy(dst, t) : MT_ERR_OOM;
        mt_tensor_unref(dst);
        if (rc) {
            mt_tensor_unref(out);
            return NULL;
        }
    }
    return finish(op, reshape_backward, t, out, NULL, 0);
}

mt_tensor *mt_reshape(mt_tensor *t, int ndim, const int64_t *shape) {
    if (!t) return NULL;
    mt_api_enter();
    return mt_api_exit(reshape_impl(MT_OP_RESHAPE, t, ndim, shape, true));
}

mt_tensor *mt_view(mt_tensor *t, int ndim, const int64_t *shape) {
    if (!t) return NULL;
    mt_api_enter();
    return mt_api_exit(reshape_impl(MT_OP_VIEW, t, ndim, shape, false));
}

mt_tensor *mt_flatten(mt_tensor *t) {
    if (!t) return NULL;
    mt_api_enter();
    int64_t n = t->numel;
    return mt_api_exit(reshape_impl(MT_OP_RESHAPE, t, 1, &n, true));
}

mt_tensor *mt_transpose(mt_tensor *t, int d0, int d1) {
    if (!t) return NULL;
    mt_api_enter();
    int a, b;
    if (mt_dim_normalize("mt_transpose", 2, d0, t->ndim, &a) < 0 ||
        mt_dim_normalize("mt_transpose", 3, d1, t->ndim, &b) < 0)
        return mt_api_exit(NULL);
    int64_t shape[MT_MAX_DIMS], strides[MT_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    memcpy(strides, t->strides, sizeof strides);
    if (t->ndim > 0) {
        shape[a] = t->shape[b];
        shape[b] = t->shape[a];
        strides[a] = t->strides[b];
        strides[b] = t->strides[a];
    }
    mt_tensor *out = mt_tensor_view_of(t, t->ndim, shape, strides, t->offset);
    int64_t ints[2] = {a, b};
    return mt_api_exit(finish(MT_OP_TRANSPOSE, transpose_backward, t, out, ints, 2));
}

mt_tensor *mt_permute(mt_tensor *t, int ndim, const int *order) {
    if (!t) return NULL;
    mt_api_enter();
    char b1[MT_SHAPE_BUF];
    if (ndim != t->ndim) {
        mt_error_set(MT_ERR_INVALID,
                     "mt_permute: arg 2: order has %d dims but the tensor of shape %s has %d", ndim,
                     mt_shape_str(t, b1, sizeof b1), t->ndim);
        return mt_api_exit(NULL);
    }
    if (ndim > 0 && !order) {
        mt_error_set(MT_ERR_NULL, "mt_permute: arg 3: order is NULL");
        return mt_api_exit(NULL);
    }
    int64_t shape[MT_MAX_DIMS], strides[MT_MAX_DIMS], ints[MT_MAX_DIMS];
    bool seen[MT_MAX_DIMS] = {0};
    for (int i = 0; i < ndim; i++) {
        int d;
        if (mt_dim_normalize("mt_permute", 3, order[i], ndim, &d) < 0) return mt_api_exit(NULL);
        if (seen[d]) {
            mt_error_set(MT_ERR_INVALID,
                         "mt_permute: arg 3: dim %d appears more than once in the order", d);
            return mt_api_exit(NULL);
        }
        seen[d] = true;
        shape[i] = t->shape[d];
        strides[i] = t->strides[d];
        ints[i] = d;
    }
    mt_tensor *out = mt_tensor_view_of(t, ndim, shape, strides, t->offset);
    return mt_api_exit(finish(MT_OP_PERMUTE, permute_backward, t, out, ints, ndim));
}

/* The view t[..., start:start+len*step:step, ...] along dim (all checked by the caller). */
static mt_tensor *slice_view(mt_tensor *t, int dim, int64_t start, int64_t len, int64_t step) {
    int64_t shape[MT_MAX_DIMS], strides[MT_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    memcpy(strides, t->strides, sizeof strides);
    shape[dim] = len;
    strides[dim] = len > 1 ? t->strides[dim] * step : t->strides[dim]; /* never stepped */
    /* an empty slice keeps the base offset so it never points past the storage */
    int64_t offset = t->offset + (len > 0 ? start * t->strides[dim] : 0);
    mt_tensor *out = mt_tensor_view_of(t, t->ndim, shape, strides, offset);
    int64_t ints[3] = {dim, len > 0 ? start : 0, step};
    return finish(MT_OP_SLICE, slice_backward, t, out, ints, 3);
}

mt_tensor *mt_narrow(mt_tensor *t, int dim, int64_t start, int64_t length) {
    if (!t) return NULL;
    mt_api_enter();
    char b1[MT_SHAPE_BUF];
    int d;
    if (t->ndim == 0) {
        mt_error_set(MT_ERR_INVALID, "mt_narrow: arg 1: cannot narrow a 0-d tensor");
        return mt_api_exit(NULL);
    }
    if (mt_dim_normalize("mt_narrow", 2, dim, t->ndim, &d) < 0) return mt_api_exit(NULL);
    int64_t size = t->shape[d];
    if (start < -size || start > size) {
        mt_error_set(MT_ERR_INVALID,
                     "mt_narrow: arg 3: start %lld is out of range for dim %d of shape %s "
                     "(expected %lld..%lld)",
                     (long long)start, d, mt_shape_str(t, b1, sizeof b1), (long long)-size,
                     (long long)size);
        return mt_api_exit(NULL);
    }
    if (start < 0) start += size;
    if (length < 0 || length > size - start) { /* (start + length would overflow) */
        mt_error_set(MT_ERR_INVALID,
                     "mt_narrow: arg 4: length %lld from start %lld exceeds dim %d of shape %s",
                     (long long)length, (long long)start, d, mt_shape_str(t, b1, sizeof b1));
        return mt_api_exit(NULL);
    }
    return mt_api_exit(slice_view(t, d, start, length, 1));
}

mt_tensor *mt_slice(mt_tensor *t, int dim, int64_t start, int64_t end, int64_t step) {
    if (!t) return NULL;
    mt_api_enter();
    int d;
    if (t->ndim == 0) {
        mt_error_set(MT_ERR_INVALID, "mt_slice: arg 1: cannot slice a 0-d tensor");
        return mt_api_exit(NULL);
    }
    if (mt_dim_normalize("mt_slice", 2, dim, t->ndim, &d) < 0) return mt_api_exit(NULL);
    if (step <= 0) {
        mt_error_set(MT_ERR_INVALID, "mt_slice: arg 5: step must be positive, got %lld",
                     (long long)step);
        return mt_api_exit(NULL);
    }
    /* Python's rules: negative bounds count from the end, then clamp into [0, size] */
    int64_t size = t->shape[d];
    if (start < 0) start = start + size < 0 ? 0 : start + size;
    if (end < 0) end = end + size < 0 ? 0 : end + size;
    if (start > size) start = size;
    if (end > size) end = size;
    int64_t len = end > start ? (end - start - 1) / step + 1 : 0; /* no overflow for any step */
    return mt_api_exit(slice_view(t, d, start, len, step));
}

mt_tensor *mt_expand(mt_tensor *t, int ndim, const int64_t *shape) {
    if (!t) return NULL;
    mt_api_enter();
    char b1[MT_SHAPE_BUF], b2[MT_SHAPE_BUF];
    if (ndim > 0 && !shape) {
        mt_error_set(MT_ERR_NULL, "mt_expand: arg 3: shape is NULL");
        return mt_api_exit(NULL);
    }
    if (ndim < t->ndim || ndim > MT_MAX_DIMS) {
        mt_error_set(MT_ERR_SHAPE,
                     "mt_expand: arg 2: cannot expand shape %s to %d dims (need %d..%d)",
                     mt_shape_str(t, b1, sizeof b1), ndim, t->ndim, MT_MAX_DIMS);
        return mt_api_exit(NULL);
    }
    int64_t ns[MT_MAX_DIMS], st[MT_MAX_DIMS];
    int lead = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        int64_t want = shape[i];
        if (i < lead) {
            if (want < 0) {
                mt_error_set(MT_ERR_SHAPE,
                             "mt_expand: arg 3: size %lld is not allowed in new leading dim %d of "
                             "%s (input shape %s)",
                             (long long)want, i, mt_dims_str(ndim, shape, b1, sizeof b1),
                             mt_shape_str(t, b2, sizeof b2));
                return mt_api_exit(NULL);
            }
            ns[i] = want;
            st[i] = 0;
            continue;
        }
        int64_t have = t->shape[i - lead];
        if (want == -1) want = have;
        if (want == have) {
            ns[i] = have;
            st[i] = t->strides[i - lead];
        } else if (have == 1 && want >= 0) {
            ns[i] = want;
            st[i] = 0;
        } else {
            mt_error_set(MT_ERR_SHAPE,
                         "mt_expand: arg 3: cannot expand shape %s to %s (dim %d: size %lld is "
                         "not 1 and does not match %lld)",
                         mt_shape_str(t, b2, sizeof b2), mt_dims_str(ndim, shape, b1, sizeof b1), i,
                         (long long)have, (long long)shape[i]);
            return mt_api_exit(NULL);
        }
    }
    int64_t numel;
    if (mt_shape_numel_checked("mt_expand", ndim, ns, &numel) < 0) return mt_api_exit(NULL);
    mt_tensor *out = mt_tensor_view_of(t, ndim, ns, st, t->offset);
    return mt_api_exit(finish(MT_OP_EXPAND, expand_backward, t, out, NULL, 0));
}

mt_tensor *mt_squeeze(mt_tensor *t, int dim) {
    if (!t) return NULL;
    mt_api_enter();
    int d;
    if (mt_dim_normalize("mt_squeeze", 2, dim, t->ndim, &d) < 0) return mt_api_exit(NULL);
    int64_t shape[MT_MAX_DIMS], strides[MT_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (i == d && t->shape[i] == 1) continue; /* a size other than 1 stays, as torch */
        shape[nd] = t->shape[i];
        strides[nd++] = t->strides[i];
    }
    mt_tensor *out = mt_tensor_view_of(t, nd, shape, strides, t->offset);
    return mt_api_exit(finish(MT_OP_SQUEEZE, reshape_backward, t, out, NULL, 0));
}

mt_tensor *mt_unsqueeze(mt_tensor *t, int dim) {
    if (!t) return NULL;
    mt_api_enter();
    int d;
    if (t->ndim >= MT_MAX_DIMS) {
        mt_error_set(MT_ERR_INVALID,
                     "mt_unsqueeze: arg 1: tensor already has %d dims (the maximum)", t->ndim);
        return mt_api_exit(NULL);
    }
    if (mt_dim_normalize_insert("mt_unsqueeze", 2, dim, t->ndim, &d) < 0) return mt_api_exit(NULL);
    int64_t shape[MT_MAX_DIMS], strides[MT_MAX_DIMS];
    for (int i = 0, j = 0; i <= t->ndim; i++) {
        if (i == d) {
            shape[i] = 1;
            strides[i] = d < t->ndim ? t->strides[d] * t->shape[d] : 1;
            continue;
        }
        shape[i] = t->shape[j];
        strides[i] = t->strides[j++];
    }
    mt_tensor *out = mt_tensor_view_of(t, t->ndim + 1, shape, strides, t->offset);
    return mt_api_exit(finish(MT_OP_UNSQUEEZE, reshape_backward, t, out, NULL, 0));
}
