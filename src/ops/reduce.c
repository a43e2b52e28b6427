/* Reductions (sum, mean, max over dims) and softmax / log_softmax along a dim.
   Sum and mean run in FP32 under autocast (reductions accumulate in FP32 whatever the
   storage; F64 in F64). Their backward expands the gradient back over the reduced dims with
   one copy kernel; max sends it to the maxima; softmax has a fused backward kernel. */
#include <math.h>
#include <string.h>
#include "dispatch.h"

/* ------------------------------------------------------------------ helpers */

/* The mask of dims to reduce; ndims == 0 means all. Errors name op and argument. */
static int reduce_mask(const char *op, const mt_tensor *t, int ndims, const int *dims,
                       uint32_t *mask) {
    int nd = t->ndim;
    *mask = 0;
    if (ndims < 0 || ndims > (nd ? nd : 1))
        return mt_error_set(MT_ERR_INVALID, "%s: arg 2: %d dims for a tensor with %d dims", op,
                            ndims, nd);
    if (ndims > 0 && !dims)
        return mt_error_set(MT_ERR_NULL, "%s: arg 3: dims is NULL with ndims %d", op, ndims);
    if (ndims == 0) {
        *mask = nd ? (uint32_t)((1u << nd) - 1) : 0;
        return 0;
    }
    for (int i = 0; i < ndims; i++) {
        int d;
        if (mt_dim_normalize(op, 3, dims[i], nd, &d) < 0) return MT_ERR_INVALID;
        if (nd == 0) continue; /* a 0-d tensor takes dim 0 or -1, like torch */
        if (*mask & (1u << d))
            return mt_error_set(MT_ERR_INVALID,
                                "%s: arg 3: dim %d appears more than once in the dims list", op,
                                dims[i]);
        *mask |= 1u << d;
    }
    return 0;
}

/* The keepdim shape of t reduced over mask, and the number of elements reduced. */
static int64_t keep_shape(const mt_tensor *t, uint32_t mask, int64_t *shape) {
    int64_t r = 1;
    for (int d = 0; d < t->ndim; d++) {
        bool red = mask & (1u << d);
        shape[d] = red ? 1 : t->shape[d];
        if (red) r *= t->shape[d];
    }
    return r;
}

/* A history-free view of keepdim result k without its reduced dims. */
static mt_tensor *squeeze_view(mt_tensor *k, uint32_t mask) {
    int64_t shape[MT_MAX_DIMS], strides[MT_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < k->ndim; d++) {
        if (mask & (1u << d)) continue;
        shape[nd] = k->shape[d];
        strides[nd++] = k->strides[d];
    }
    return mt_tensor_view_of(k, nd, shape, strides, k->offset);
}

/* A view of g (the gradient of a result reduced over mask, keepdim or not) with the input's
   rank: size-1 reduced dims reinserted. */
static mt_tensor *keepdim_view(mt_tensor *g, const mt_input_meta *m, uint32_t mask) {
    if (g->ndim == m->ndim) return mt_tensor_ref(g);
    int64_t shape[MT_MAX_DIMS], strides[MT_MAX_DIMS];
    int j = 0;
    for (int d = 0; d < m->ndim; d++) {
        if (mask & (1u << d)) {
            shape[d] = 1;
            strides[d] = 0;
        } else {
            shape[d] = g->shape[j];
            strides[d] = g->strides[j++];
        }
    }
    return mt_tensor_view_of(g, m->ndim, shape, strides, g->offset);
}

/* g * scale broadcast back to input 0's shape and dtype, as a new contiguous tensor. The
   scale runs on the small gradient, the broadcast is one copy kernel. */
static int expand_back(mt_node *n, mt_tensor *g, double scale, mt_tensor **grad_in) {
    const mt_input_meta *m = &n->inputs[0];
    uint32_t mask = (uint32_t)n->ints[0];
    const mt_backend *be = mt_backend_get(g->device);
    mt_tensor *gs = NULL;
    if (scale != 1.0) {
        gs = mt_tensor_new(mt_op_fullname(n->op), g->ndim, g->shape, g->dtype, g->device);
        if (!gs) return mt_backward_failed();
        int rc = be->unary(MT_OP_MUL_SCALAR, gs, g, scale);
        if (rc) {
            mt_tensor_unref(gs);
            return rc;
        }
    }
    mt_tensor *src = gs ? gs : g;
    mt_tensor *k = keepdim_view(src, m, mask);
    mt_tensor *e = k ? mt_tensor_expand_to(k, m->ndim, m->shape) : NULL;
    mt_tensor *out =
        e ? mt_tensor_new(mt_op_fullname(n->op), m->ndim, m->shape, m->dtype, g->device) : NULL;
    int rc = out ? be->copy(out, e) : mt_backward_failed();
    mt_tensor_unref(gs);
    mt_tensor_unref(k);
    mt_tensor_unref(e);
    if (rc) {
        mt_tensor_unref(out);
        return rc;
    }
    grad_in[0] = out;
    return 0;
}

/* ------------------------------------------------------------------ backward formulas */

/* ints[0] = mask, ints[1] = number of reduced elements */
static int sum_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    return expand_back(n, g, 1.0, gi);
}

static int mean_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    return expand_back(n, g, n->ints[1] ? 1.0 / (double)n->ints[1] : NAN, gi);
}

/* max: the gradient goes to the positions equal to the maximum; when several elements tie
   for the maximum it is split evenly among them (as torch's amax backward). Saved: input x
   and the keepdim result. */
static int max_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    mt_tensor *x = n->saved[0], *y = n->saved[1];
    uint32_t mask = (uint32_t)n->ints[0];
    int dims[MT_MAX_DIMS], nd = 0;
    for (int d = 0; d < x->ndim; d++)
        if (mask & (1u << d)) dims[nd++] = d;
    /* the elements that are the maximum (y broadcasts over the reduced dims); a NaN maximum
       is the NaN elements themselves (x != x), which x == y would never find, so that the
       gradient goes to them as torch's max does, not NaN to every element */
    mt_tensor *hit = mt_eq(x, y), *xnan = mt_ne(x, x), *ynan = mt_ne(y, y);
    mt_tensor *wh = hit ? mt_cast(hit, x->dtype) : NULL,
              *wx = xnan ? mt_cast(xnan, x->dtype) : NULL;
    mt_tensor *wy = ynan ? mt_cast(ynan, x->dtype) : NULL;
    mt_tensor *wn = wx && wy ? mt_mul(wx, wy) : NULL;
    mt_tensor *w = wh && wn ? mt_add(wh, wn) : NULL;
    mt_tensor *tmp[] = {hit, xnan, ynan, wh, wx, wy, wn};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++) mt_tensor_unref(tmp[i]);
    mt_tensor *cnt = w ? (nd ? mt_sum(w, nd, dims, true) : mt_tensor_ref(w)) : NULL;
    mt_tensor *share = cnt ? mt_div(w, cnt) : NULL;
    mt_tensor_unref(w);
    mt_tensor_unref(cnt);
    mt_tensor *k = share ? keepdim_view(g, &n->inputs[0], mask) : NULL;
    mt_tensor *r = k ? mt_mul(share, k) : NULL;
    mt_tensor_unref(share);
    mt_tensor_unref(k);
    if (!r) return mt_backward_failed();
    if (r->dtype != n->inputs[0].dtype) {
        mt_tensor *c = mt_cast(r, n->inputs[0].dtype);
        mt_tensor_unref(r);
        r = c;
        if (!r) return mt_backward_failed();
    }
    gi[0] = r;
    return 0;
}

/* ------------------------------------------------------------------ reductions */

/* name: the public function called (mt_sum or mt_sum_all, ...), for messages. */
static mt_tensor *reduce_op(const char *name, mt_op_id op, mt_tensor *t, int ndims, const int *dims,
                            bool keepdim) {
    if (mt_check_floating(name, 1, t) < 0) return NULL;
    uint32_t mask;
    if (reduce_mask(name, t, ndims, dims, &mask) < 0) return NULL;
    int64_t kshape[MT_MAX_DIMS];
    int64_t count = keep_shape(t, mask, kshape);
    if (op == MT_OP_MAX && count == 0) {
        char sb[MT_SHAPE_BUF];
        mt_error_set(MT_ERR_SHAPE, "%s: arg 1: cannot take the max over an empty dim (shape %s)",
                     name, mt_shape_str(t, sb, sizeof sb));
        return NULL;
    }
    mt_tensor *c;
    int compute = mt_dispatch_upcast_input(op, t, &c);
    if (compute < 0) return NULL;
    mt_tensor *kept = mt_tensor_new(name, t->ndim, kshape, (mt_dtype)compute, t->device);
    int rc = kept ? mt_backend_get(t->device)->reduce(op, kept, c, mask) : MT_ERR_OOM;
    mt_tensor *out = NULL;
    if (rc == 0) {
        out = keepdim ? mt_tensor_ref(kept) : squeeze_view(kept, mask);
        if (!out) rc = MT_ERR_OOM;
    }
    if (rc == 0) {
        mt_backward_fn bw = op == MT_OP_SUM    ? sum_backward
                            : op == MT_OP_MEAN ? mean_backward
                                               : max_backward;
        mt_node *node = mt_record(op, bw, &c, 1, out, &rc);
        if (node) {
            node->ints[0] = mask;
            node->ints[1] = count;
            node->n_ints = 2;
            if (op == MT_OP_MAX) {
                rc = mt_node_save(node, 0, c);
                if (!rc) rc = mt_node_save(node, 1, kept);
            }
        }
    }
    mt_tensor_unref(kept);
    if (rc) {
        mt_tensor_unref(out);
        out = NULL;
    }
    mt_dispatch_done(op, (mt_dtype)compute, out, &t, 1);
    mt_tensor_unref(c);
    return out;
}

#define REDUCE_API(fn, OP)                                                                         \
    mt_tensor *fn(mt_tensor *t, int ndims, const int *dims, bool keepdim) {                        \
        if (!t) return NULL;                                                                       \
        mt_api_enter();                                                                            \
        return mt_api_exit(reduce_op(#fn, OP, t, ndims, dims, keepdim));                           \
    }                                                                                              \
    mt_tensor *fn##_all(mt_tensor *t) {                                                            \
        if (!t) return NULL;                                                                       \
        mt_api_enter();                                                                            \
        return mt_api_exit(reduce_op(#fn "_all", OP, t, 0, NULL, false));                          \
    }
REDUCE_API(mt_sum, MT_OP_SUM)
REDUCE_API(mt_mean, MT_OP_MEAN)
REDUCE_API(mt_max, MT_OP_MAX)

/* ------------------------------------------------------------------ softmax */

/* ints[0] = dim; saved[0] = the output */
static int softmax_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    mt_tensor *y = n->saved[0];
    bool log = n->op == MT_OP_LOG_SOFTMAX;
    mt_tensor *out = mt_tensor_new(mt_op_fullname(n->op), y->ndim, y->shape, y->dtype, y->device);
    if (!out) return mt_backward_failed();
    mt_tensor *gc = g->dtype == y->dtype ? mt_tensor_ref(g) : mt_cast(g, y->dtype);
    int rc = gc ? mt_backend_get(y->device)->softmax_backward(out, gc, y, (int)n->ints[0], log)
                : mt_backward_failed();
    mt_tensor_unref(gc);
    if (rc == 0 && out->dtype != n->inputs[0].dtype) {
        mt_tensor *c = mt_cast(out, n->inputs[0].dtype);
        mt_tensor_unref(out);
        out = c;
        if (!out) rc = mt_backward_failed();
    }
    if (rc) {
        mt_tensor_unref(out);
        return rc;
    }
    gi[0] = out;
    return 0;
}

static mt_tensor *softmax_op(mt_op_id op, mt_tensor *t, int dim) {
    const char *name = mt_op_fullname(op);
    if (mt_check_floating(name, 1, t) < 0) return NULL;
    int d;
    if (mt_dim_normalize(name, 2, dim, t->ndim, &d) < 0) return NULL;
    mt_tensor *c;
    int compute = mt_dispatch_upcast_input(op, t, &c);
    if (compute < 0) return NULL;
    mt_tensor *out = mt_tensor_new(name, t->ndim, t->shape, (mt_dtype)compute, t->device);
    int rc =
        out ? mt_backend_get(t->device)->softmax(out, c, d, op == MT_OP_LOG_SOFTMAX) : MT_ERR_OOM;
    if (rc == 0) {
        mt_node *node = mt_record(op, softmax_backward, &c, 1, out, &rc);
        if (node) {
            node->ints[0] = d;
            node->n_ints = 1;
            rc = mt_node_save(node, 0, out);
        }
    }
    if (rc) {
        mt_tensor_unref(out);
        out = NULL;
    }
    mt_dispatch_done(op, (mt_dtype)compute, out, &t, 1);
    mt_tensor_unref(c);
    return out;
}

mt_tensor *mt_softmax(mt_tensor *t, int dim) {
    if (!t) return NULL;
    mt_api_enter();
    return mt_api_exit(softmax_op(MT_OP_SOFTMAX, t, dim));
}

mt_tensor *mt_log_softmax(mt_tensor *t, int dim) {
    if (!t) return NULL;
    mt_api_enter();
    return mt_api_exit(softmax_op(MT_OP_LOG_SOFTMAX, t, dim));
}
