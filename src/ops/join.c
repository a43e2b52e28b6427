/* Joining: cat and stack. Inputs are promoted to a common dtype (PROMOTE rule, through the
   dispatcher, so autocast and gradients to FP32 parameters work as for add), then each is
   copied by the backend copy kernel into its window of the output. The backward hands each
   input the matching window of the gradient. Any number of inputs: the node's input list is
   dynamic. */
#include <stdlib.h>
#include <string.h>
#include "dispatch.h"

/* The window of g that input i came from: along dim, `len` entries from `start` (cat), or
   the single index `start` with dim removed (stack). A view with no history. */
static mt_tensor *window(mt_tensor *g, int dim, int64_t start, int64_t len, bool drop_dim) {
    int64_t shape[MT_MAX_DIMS], strides[MT_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < g->ndim; d++) {
        if (d == dim && drop_dim) continue;
        shape[nd] = d == dim ? len : g->shape[d];
        strides[nd++] = g->strides[d];
    }
    return mt_tensor_view_of(g, nd, shape, strides, g->offset + start * g->strides[dim]);
}

static int join_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    int dim = (int)n->ints[0];
    bool stack = n->op == MT_OP_STACK;
    int64_t start = 0;
    for (int i = 0; i < n->n_inputs; i++) {
        int64_t len = stack ? 1 : n->inputs[i].shape[dim];
        if (mt_node_needs(n, i)) {
            gi[i] = window(g, dim, start, len, stack);
            if (!gi[i]) return MT_ERR_OOM;
        }
        start += len;
    }
    return 0;
}

/* The arguments: a tensor array of n >= 1 tensors on one device whose shapes fit (equal for
   stack; equal but in dim for cat), and one dtype unless a floating one is among them. *d gets
   the normalised dim, *any_float whether the inputs are promoted. Nonzero on an error (set,
   or an earlier one that a NULL input carries). */
static int join_check(const char *name, bool stack, mt_tensor *const *ts, int n, int dim, int *d,
                      bool *any_float) {
    char b1[MT_SHAPE_BUF], b2[MT_SHAPE_BUF];
    if (!ts && n > 0)
        return mt_error_set(MT_ERR_INVALID,
                            "%s: arg 2: n is %d but the tensor array (arg 1) is NULL", name, n);
    if (n <= 0)
        return mt_error_set(MT_ERR_INVALID, "%s: arg 2: needs at least one tensor, got %d", name,
                            n);
    for (int i = 0; i < n; i++)
        if (!ts[i]) return MT_ERR_NULL; /* an earlier error: propagate */
    const mt_tensor *t0 = ts[0];
    if (!stack && t0->ndim == 0)
        return mt_error_set(MT_ERR_SHAPE,
                            "%s: arg 1: tensor 0 is 0-d; 0-d tensors cannot be joined "
                            "(use mt_stack)",
                            name);
    if (stack && t0->ndim >= MT_MAX_DIMS)
        return mt_error_set(MT_ERR_SHAPE,
                            "%s: arg 1: tensors have %d dims; the result would exceed %d", name,
                            t0->ndim, MT_MAX_DIMS);
    int rc = stack ? mt_dim_normalize_insert(name, 3, dim, t0->ndim, d)
                   : mt_dim_normalize(name, 3, dim, t0->ndim, d);
    if (rc < 0) return rc;
    *any_float = false;
    for (int i = 0; i < n; i++) {
        const mt_tensor *t = ts[i];
        if ((rc = mt_check_same_device(name, t0, t)) < 0) return rc;
        bool fits = t->ndim == t0->ndim;
        for (int k = 0; fits && k < t0->ndim; k++)
            fits = t->shape[k] == t0->shape[k] || (!stack && k == *d);
        if (!fits) {
            mt_shape_str(t, b1, sizeof b1);
            mt_shape_str(t0, b2, sizeof b2);
            if (stack)
                return mt_error_set(MT_ERR_SHAPE,
                                    "%s: arg 1: tensor %d has shape %s but tensor 0 has "
                                    "shape %s (all shapes must be equal)",
                                    name, i, b1, b2);
            return mt_error_set(MT_ERR_SHAPE,
                                "%s: arg 1: tensor %d has shape %s but tensor 0 has "
                                "shape %s (sizes must match except in dim %d)",
                                name, i, b1, b2, *d);
        }
        *any_float |= mt_dtype_is_floating(t->dtype);
    }
    for (int i = 0; i < n && !*any_float; i++) /* integer or bool tensors are not promoted */
        if (ts[i]->dtype != t0->dtype)
            return mt_error_set(MT_ERR_DTYPE,
                                "%s: arg 1: tensor %d has dtype %s but tensor 0 has %s", name, i,
                                mt_dtype_name(ts[i]->dtype), mt_dtype_name(t0->dtype));
    return 0;
}

/* The result's shape: tensor 0's with n inserted at d (stack) or the sizes along d added
   (cat). Returns its rank, or a negative status when the sizes overflow. */
static int join_shape(const char *name, bool stack, mt_tensor *const *ts, int n, int d,
                      int64_t *shape) {
    const mt_tensor *t0 = ts[0];
    int nd = stack ? t0->ndim + 1 : t0->ndim;
    for (int k = 0, j = 0; k < nd; k++) shape[k] = stack && k == d ? n : t0->shape[j++];
    if (stack) return nd;
    shape[d] = 0;
    for (int i = 0; i < n; i++)
        if (__builtin_add_overflow(shape[d], ts[i]->shape[d], &shape[d]))
            return mt_error_set(MT_ERR_SHAPE, "%s: the sizes along dim %d add up to more than 2^63",
                                name, d);
    return nd;
}

/* Shared path: validates, promotes, allocates and copies. stack inserts a new dim. */
static mt_tensor *join(mt_op_id op, mt_tensor *const *ts, int n, int dim) {
    const char *name = mt_op_fullname(op);
    bool stack = op == MT_OP_STACK, any_float = false;
    int d = 0, nd;
    int64_t shape[MT_MAX_DIMS];
    if (join_check(name, stack, ts, n, dim, &d, &any_float)) return NULL;
    if ((nd = join_shape(name, stack, ts, n, d, shape)) < 0) return NULL;
    mt_tensor *small[8], **cast = n <= 8 ? small : mt_heap_alloc((size_t)n * sizeof *cast);
    if (!cast) {
        mt_error_set(MT_ERR_OOM, "%s: out of memory for %d inputs", name, n);
        return NULL;
    }
    mt_tensor *out = NULL;
    int compute = mt_dispatch_inputs(op, ts, n, cast);
    if (compute < 0) goto done;
    /* integer inputs next to floating ones are converted by the copy kernel */
    mt_dtype out_dt = any_float ? (mt_dtype)compute : ts[0]->dtype;

    out = mt_tensor_new(name, nd, shape, out_dt, ts[0]->device);
    int rc = out ? 0 : MT_ERR_OOM;
    const mt_backend *be = mt_backend_get(ts[0]->device);
    int64_t start = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        int64_t len = stack ? 1 : cast[i]->shape[d];
        mt_tensor *w = window(out, d, start, len, stack);
        rc = w ? be->copy(w, cast[i]) : MT_ERR_OOM;
        mt_tensor_unref(w);
        start += len;
    }
    if (rc == 0) {
        mt_node *node = mt_record(op, join_backward, cast, n, out, &rc);
        if (node) {
            node->ints[0] = d;
            node->n_ints = 1;
        }
    }
    if (rc) {
        mt_tensor_unref(out);
        out = NULL;
    }
    mt_dispatch_done(op, (mt_dtype)compute, out, ts, n);
    mt_dispatch_release(cast, n);
done:
    if (cast != small) free(cast);
    return out;
}

mt_tensor *mt_cat(mt_tensor *const *ts, int n, int dim) {
    mt_api_enter();
    return mt_api_exit(join(MT_OP_CAT, ts, n, dim));
}

mt_tensor *mt_stack(mt_tensor *const *ts, int n, int dim) {
    mt_api_enter();
    return mt_api_exit(join(MT_OP_STACK, ts, n, dim));
}
