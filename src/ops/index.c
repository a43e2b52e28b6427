/* Indexing ops: mt_index_select, mt_embedding and mt_gather (differentiable: their
   backwards add the incoming gradient back at the indexed places, deterministically, in
   FP32/F64 before one rounding to the input's dtype), mt_argmax (I64, not differentiable)
   and mt_randperm (from the global Philox generator). Indices are I64. On the CPU they are
   checked before the kernel runs: an out-of-range one is an error naming the op, its
   position and its value. A device checks them in its kernel instead (reading them here
   would be a host sync in every step that embeds a batch): the same error, deferred to the
   next synchronisation, and zeros where the bad index pointed. */
#include <stdlib.h>
#include "../math/philox.h"
#include "dispatch.h"

/* Every index in [0, bound): else MT_ERR_INVALID naming op, arg, the position and value.
   Host tensors only: a device's kernel does it. */
static int check_indices(const char *op, int arg, const mt_tensor *index, int64_t bound,
                         const char *what) {
    if (index->device.type != MT_DEVICE_CPU) return 0;
    int64_t n = index->numel;
    const int64_t *v;
    int64_t *copy = NULL;
    if (mt_is_contiguous(index)) {
        v = mt_tensor_data(index);
    } else {
        copy = mt_heap_alloc((size_t)(n ? n : 1) * sizeof *copy);
        if (!copy)
            return mt_error_set(MT_ERR_OOM, "%s: out of memory reading %lld indices", op,
                                (long long)n);
        int rc = mt_copy_to_host(index, copy, (size_t)n * sizeof *copy);
        if (rc) {
            free(copy);
            return rc;
        }
        v = copy;
    }
    int rc = 0;
    for (int64_t i = 0; i < n && rc == 0; i++)
        if (v[i] < 0 || v[i] >= bound)
            rc = mt_error_set(MT_ERR_INVALID,
                              "%s: arg %d: index %lld at position %lld is out of range [0, %lld) "
                              "(%s)",
                              op, arg, (long long)v[i], (long long)i, (long long)bound, what);
    free(copy);
    return rc;
}

static int check_index_tensor(const char *op, int arg, const mt_tensor *x, const mt_tensor *index) {
    if (index->dtype != MT_I64)
        return mt_error_set(MT_ERR_DTYPE, "%s: arg %d: indices must be i64, got %s", op, arg,
                            mt_dtype_name(index->dtype));
    return mt_check_same_device(op, x, index);
}

/* The gradient of an indexing op: zeros of the input's shape in the accumulation dtype,
   the adjoint kernel, one rounding to the input's dtype. */
typedef int (*adjoint_fn)(const mt_backend *be, mt_tensor *dst, int dim, const mt_tensor *index,
                          const mt_tensor *src);

static int adjoint_backward(mt_node *n, mt_tensor *g, mt_tensor **gi, adjoint_fn fn,
                            const mt_tensor *index, int dim) {
    const mt_input_meta *m = &n->inputs[0];
    mt_dtype acc = mt_norm_acc_dtype(m->dtype);
    mt_tensor *gc = mt_dispatch_dense(g, g->dtype);
    mt_tensor *acc_t = gc ? mt_zeros(m->ndim, m->shape, acc, g->device) : NULL;
    int rc = acc_t ? fn(mt_backend_get(g->device), acc_t, dim, index, gc) : mt_backward_failed();
    mt_tensor_unref(gc);
    if (rc == 0) {
        gi[0] = mt_cast(acc_t, m->dtype);
        if (!gi[0]) rc = mt_backward_failed();
    }
    mt_tensor_unref(acc_t);
    return rc;
}

static int run_index_add(const mt_backend *be, mt_tensor *dst, int dim, const mt_tensor *index,
                         const mt_tensor *src) {
    return be->index_add(dst, dim, index, src);
}
static int run_scatter_add(const mt_backend *be, mt_tensor *dst, int dim, const mt_tensor *index,
                           const mt_tensor *src) {
    return be->scatter_add(dst, dim, index, src);
}

/* ---------------------------------------------------------------- index_select, embedding */

/* saved[0] = the flat contiguous index; ints[0] = dim */
static int index_select_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    return adjoint_backward(n, g, gi, run_index_add, n->saved[0], (int)n->ints[0]);
}

/* out = x's rows (along dim) named by the flat index idx, shaped [..., len(idx), ...] and
   then viewed as out_ndim/out_shape; records op. */
static mt_tensor *select_rows(mt_op_id op, mt_tensor *x, int dim, mt_tensor *index, int out_ndim,
                              const int64_t *out_shape) {
    const char *name = mt_op_fullname(op);
    mt_tensor *xc = mt_dispatch_dense_input(op, x);
    mt_dtype dt = xc ? xc->dtype : x->dtype;
    mt_tensor *ic = xc ? mt_dispatch_dense(index, MT_I64) : NULL;
    int64_t k = index->numel;
    mt_tensor *flat = ic ? mt_tensor_view_of(ic, 1, &k, NULL, ic->offset) : NULL;
    mt_tensor *out = flat ? mt_tensor_new(name, out_ndim, out_shape, dt, x->device) : NULL;
    int rc = out ? 0 : MT_ERR_OOM;
    if (!xc || !ic) rc = mt_backward_failed();
    if (rc == 0) rc = mt_backend_get(x->device)->index_select(out, xc, dim, flat, op);
    if (rc == 0) {
        mt_node *node = mt_record(op, index_select_backward, &xc, 1, out, &rc);
        if (node) {
            node->ints[0] = dim;
            node->n_ints = 1;
            rc = mt_node_save(node, 0, flat);
        }
    }
    mt_tensor_unref(flat);
    mt_tensor_unref(ic);
    mt_tensor_unref(xc);
    if (rc) {
        mt_tensor_unref(out);
        out = NULL;
    }
    mt_dispatch_done(op, dt, out, &x, 1);
    return out;
}

static mt_tensor *index_select(mt_tensor *x, int dim, mt_tensor *index) {
    const char *name = "mt_index_select";
    int d;
    if (check_index_tensor(name, 3, x, index) < 0) return NULL;
    if (x->ndim == 0) { /* the result's size along dim is the index's length */
        mt_error_set(MT_ERR_SHAPE, "%s: arg 1: input must have at least 1 dim, got a 0-d tensor",
                     name);
        return NULL;
    }
    if (mt_dim_normalize(name, 2, dim, x->ndim, &d) < 0) return NULL;
    if (index->ndim > 1) {
        char s[MT_SHAPE_BUF];
        mt_error_set(MT_ERR_SHAPE, "%s: arg 3: index must be 0-d or 1-d, got shape %s", name,
                     mt_shape_str(index, s, sizeof s));
        return NULL;
    }
    char what[64];
    snprintf(what, sizeof what, "dim %d has size %lld", d, (long long)x->shape[d]);
    if (check_indices(name, 3, index, x->shape[d], what) < 0) return NULL;
    int64_t shape[MT_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = i == d ? index->numel : x->shape[i];
    return select_rows(MT_OP_INDEX_SELECT, x, d, index, x->ndim, shape);
}

mt_tensor *mt_index_select(mt_tensor *x, int dim, mt_tensor *index) {
    if (!x || !index) return NULL;
    mt_api_enter();
    return mt_api_exit(index_select(x, dim, index));
}

static mt_tensor *embedding(mt_tensor *weight, mt_tensor *indices) {
    const char *name = "mt_embedding";
    char s[MT_SHAPE_BUF];
    if (mt_check_floating(name, 1, weight) < 0 || check_index_tensor(name, 2, weight, indices) < 0)
        return NULL;
    if (weight->ndim != 2) {
        mt_error_set(MT_ERR_SHAPE, "%s: arg 1: weight must be [num_embeddings, dim], got %s", name,
                     mt_shape_str(weight, s, sizeof s));
        return NULL;
    }
    if (indices->ndim + 1 > MT_MAX_DIMS) {
        mt_error_set(MT_ERR_SHAPE, "%s: arg 2: indices have %d dims, at most %d allowed", name,
                     indices->ndim, MT_MAX_DIMS - 1);
        return NULL;
    }
    char what[64];
    snprintf(what, sizeof what, "weight has %lld rows", (long long)weight->shape[0]);
    if (check_indices(name, 2, indices, weight->shape[0], what) < 0) return NULL;
    int64_t shape[MT_MAX_DIMS];
    for (int i = 0; i < indices->ndim; i++) shape[i] = indices->shape[i];
    shape[indices->ndim] = weight->shape[1];
    return select_rows(MT_OP_EMBEDDING, weight, 0, indices, indices->ndim + 1, shape);
}

mt_tensor *mt_embedding(mt_tensor *weight, mt_tensor *indices) {
    if (!weight || !indices) return NULL;
    mt_api_enter();
    return mt_api_exit(embedding(weight, indices));
}

/* ---------------------------------------------------------------- gather */

/* saved[0] = the contiguous index; ints[0] = dim */
static int gather_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    return adjoint_backward(n, g, gi, run_scatter_add, n->saved[0], (int)n->ints[0]);
}

static int check_gather_shape(const char *name, const mt_tensor *x, int d, const mt_tensor *index) {
    bool ok = index->ndim == x->ndim;
    for (int i = 0; ok && i < x->ndim; i++) ok = i == d || index->shape[i] <= x->shape[i];
    if (ok) return 0;
    char a[MT_SHAPE_BUF], b[MT_SHAPE_BUF];
    return mt_error_set(MT_ERR_SHAPE,
                        "%s: arg 3: index shape %s must have input %s's ndim and no larger size "
                        "outside dim %d",
                        name, mt_shape_str(index, a, sizeof a), mt_shape_str(x, b, sizeof b), d);
}

static mt_tensor *gather(mt_tensor *x, int dim, mt_tensor *index) {
    const char *name = "mt_gather";
    int d;
    if (check_index_tensor(name, 3, x, index) < 0 ||
        mt_dim_normalize(name, 2, dim, x->ndim ? x->ndim : 1, &d) < 0 ||
        check_gather_shape(name, x, d, index) < 0)
        return NULL;
    int64_t size = x->ndim ? x->shape[d] : 1;
    char what[64];
    snprintf(what, sizeof what, "dim %d has size %lld", d, (long long)size);
    if (check_indices(name, 3, index, size, what) < 0) return NULL;
    mt_tensor *xc = mt_dispatch_dense_input(MT_OP_GATHER, x);
    mt_dtype dt = xc ? xc->dtype : x->dtype;
    mt_tensor *ic = xc ? mt_dispatch_dense(index, MT_I64) : NULL;
    mt_tensor *out = ic ? mt_tensor_new(name, index->ndim, index->shape, dt, x->device) : NULL;
    int rc = out ? 0 : MT_ERR_OOM;
    if (!xc || !ic) rc = mt_backward_failed();
    if (rc == 0) rc = mt_backend_get(x->device)->gather(out, xc, d, ic);
    if (rc == 0) {
        mt_node *node = mt_record(MT_OP_GATHER, gather_backward, &xc, 1, out, &rc);
        if (node) {
            node->ints[0] = d;
            node->n_ints = 1;
            rc = mt_node_save(node, 0, ic);
        }
    }
    mt_tensor_unref(ic);
    mt_tensor_unref(xc);
    if (rc) {
        mt_tensor_unref(out);
        out = NULL;
    }
    mt_dispatch_done(MT_OP_GATHER, dt, out, &x, 1);
    return out;
}

mt_tensor *mt_gather(mt_tensor *x, int dim, mt_tensor *index) {
    if (!x || !index) return NULL;
    mt_api_enter();
    return mt_api_exit(gather(x, dim, index));
}

/* ---------------------------------------------------------------- argmax, randperm */

static mt_tensor *argmax(mt_tensor *x, int dim, bool keepdim) {
    const char *name = "mt_argmax";
    int d;
    if (x->dtype == MT_BOOL) {
        mt_error_set(MT_ERR_DTYPE, "%s: arg 1: bool input is not supported", name);
        return NULL;
    }
    if (mt_dim_normalize(name, 2, dim, x->ndim ? x->ndim : 1, &d) < 0) return NULL;
    if (x->ndim && x->shape[d] == 0) {
        mt_error_set(MT_ERR_SHAPE, "%s: arg 2: dim %d has size 0: no maximum", name, d);
        return NULL;
    }
    mt_tensor *xc = mt_dispatch_dense_input(MT_OP_ARGMAX, x);
    mt_dtype dt = xc ? xc->dtype : x->dtype;
    int64_t kept[MT_MAX_DIMS], squeezed[MT_MAX_DIMS];
    int nk = 0;
    for (int i = 0; i < x->ndim; i++) {
        kept[i] = i == d ? 1 : x->shape[i];
        if (i != d) squeezed[nk++] = x->shape[i];
    }
    mt_tensor *out = xc ? mt_tensor_new(name, x->ndim, kept, MT_I64, x->device) : NULL;
    int rc = out ? mt_backend_get(x->device)->argmax(out, xc, d) : MT_ERR_OOM;
    if (!xc) rc = mt_backward_failed();
    mt_tensor_unref(xc);
    mt_tensor *res = NULL;
    if (rc == 0)
        res =
            keepdim ? mt_tensor_ref(out) : mt_tensor_view_of(out, nk, squeezed, NULL, out->offset);
    mt_tensor_unref(out);
    mt_dispatch_done(MT_OP_ARGMAX, dt, res, &x, 1);
    return res;
}

mt_tensor *mt_argmax(mt_tensor *x, int dim, bool keepdim) {
    if (!x) return NULL;
    mt_api_enter();
    return mt_api_exit(argmax(x, dim, keepdim));
}

/* Fisher-Yates from the end: step i swaps i with j uniform in [0, i], j from 64 random bits
   (two Philox lanes; the modulo bias is below 2^-40 for any n that fits in memory). */
static mt_tensor *randperm(int64_t n, mt_device dev) {
    const char *name = "mt_randperm";
    if (n < 0) {
        mt_error_set(MT_ERR_INVALID, "%s: arg 1: n %lld must be >= 0", name, (long long)n);
        return NULL;
    }
    if (!mt_backend_for(name, dev)) return NULL;
    size_t bytes = (size_t)(n ? n : 1) * sizeof(int64_t);
    int64_t *p = (uint64_t)n <= SIZE_MAX / sizeof(int64_t) ? mt_heap_alloc(bytes) : NULL;
    if (!p) {
        mt_error_set(MT_ERR_OOM, "%s: out of memory for %lld values", name, (long long)n);
        return NULL;
    }
    /* the result exists before the draw: a failed call leaves the generator alone */
    mt_tensor *out = mt_tensor_new(name, 1, &n, MT_I64, dev);
    if (!out || mt_scope_reserve() < 0) {
        mt_tensor_unref(out);
        free(p);
        return NULL;
    }
    uint64_t seed, offset;
    mt_rng_reserve(2 * (uint64_t)n, &seed, &offset);
    for (int64_t i = 0; i < n; i++) p[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        mt_philox_block b = mt_philox4x32(offset + (uint64_t)i / 2, seed);
        unsigned lane = (unsigned)(i % 2) * 2;
        uint64_t r = (uint64_t)b.v[lane] << 32 | b.v[lane + 1];
        int64_t j = (int64_t)(r % (uint64_t)(i + 1)), t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
    if (mt_backend_get(dev)->upload(out, p) < 0) {
        mt_tensor_unref(out);
        out = NULL;
    }
    free(p);
    return out;
}

mt_tensor *mt_randperm(int64_t n, mt_device dev) {
    mt_api_enter();
    return mt_api_exit(randperm(n, dev));
}
