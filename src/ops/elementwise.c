/* Elementwise ops: binary (broadcasting), tensor-scalar, unary, comparisons and where.
   Each family has one entry path; the ops differ only in their table row, their formula in
   src/math and their backward formula below (written with ops). */
#include "dispatch.h"

/* ------------------------------------------------------------------ backward formulas */

/* g reduced to input i and handed out, or NULL when input i needs none. Takes g. */
static int give(mt_node *n, int i, mt_tensor *g, mt_tensor **grad_in) {
    if (!g) return mt_backward_failed();
    if (!mt_node_needs(n, i)) {
        mt_tensor_unref(g);
        return 0;
    }
    grad_in[i] = mt_grad_reduce_to_input(n, i, g);
    mt_tensor_unref(g);
    return grad_in[i] ? 0 : mt_backward_failed();
}

static int add_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    int rc = give(n, 0, mt_tensor_ref(g), gi);
    return rc ? rc : give(n, 1, mt_tensor_ref(g), gi);
}

static int sub_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    int rc = give(n, 0, mt_tensor_ref(g), gi);
    return rc ? rc : mt_node_needs(n, 1) ? give(n, 1, mt_neg(g), gi) : 0;
}

static int mul_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    mt_tensor *a = n->saved[0], *b = n->saved[1];
    int rc = mt_node_needs(n, 0) ? give(n, 0, mt_mul(g, b), gi) : 0;
    return rc ? rc : mt_node_needs(n, 1) ? give(n, 1, mt_mul(g, a), gi) : 0;
}

static int div_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    mt_tensor *b = n->saved[1], *y = n->saved[2];
    int rc = mt_node_needs(n, 0) ? give(n, 0, mt_div(g, b), gi) : 0;
    if (rc || !mt_node_needs(n, 1)) return rc;
    /* d(a/b)/db = -(a/b)/b = -y/b */
    mt_tensor *t = mt_div(y, b), *u = t ? mt_mul(g, t) : NULL;
    mt_tensor_unref(t);
    mt_tensor *v = u ? mt_neg(u) : NULL;
    mt_tensor_unref(u);
    return give(n, 1, v, gi);
}

/* r where cond is false, 0 where it is true (torch's masked gradients); takes r. */
static mt_tensor *zero_where(mt_tensor *cond, mt_tensor *r) {
    mt_tensor *zero = r ? mt_zeros(0, NULL, r->dtype, r->device) : NULL;
    mt_tensor *out = cond && zero ? mt_where(cond, zero, r) : NULL;
    mt_tensor_unref(zero);
    mt_tensor_unref(r);
    return out;
}

/* As torch: the base gradient b * a^(b-1) is 0 where b == 0 (0^0 included), and the exponent
   gradient y * log(a) is 0 where a == 0 and b >= 0 (not 0 * -inf = nan). */
static int pow_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    mt_tensor *a = n->saved[0], *b = n->saved[1], *y = n->saved[2];
    mt_tensor *zero = mt_zeros(0, NULL, a->dtype, a->device);
    if (!zero) return mt_backward_failed();
    int rc = 0;
    if (mt_node_needs(n, 0)) {
        mt_tensor *bm1 = mt_add_scalar(b, -1.0), *p = bm1 ? mt_pow(a, bm1) : NULL;
        mt_tensor *q = p ? mt_mul(p, b) : NULL;
        mt_tensor_unref(bm1);
        mt_tensor_unref(p);
        mt_tensor *r = q ? mt_mul(g, q) : NULL, *b0 = mt_eq(b, zero);
        mt_tensor_unref(q);
        rc = give(n, 0, zero_where(b0, r), gi);
        mt_tensor_unref(b0);
    }
    if (rc == 0 && mt_node_needs(n, 1)) {
        mt_tensor *l = mt_log(a), *q = l ? mt_mul(y, l) : NULL;
        mt_tensor_unref(l);
        mt_tensor *r = q ? mt_mul(g, q) : NULL;
        mt_tensor_unref(q);
        mt_tensor *a0 = mt_eq(a, zero), *bnn = mt_ge(b, zero);
        /* 0 where b >= 0, taken only where a == 0 */
        mt_tensor *masked = r ? zero_where(bnn, mt_tensor_ref(r)) : NULL;
        mt_tensor *r2 = masked && a0 ? mt_where(a0, masked, r) : NULL;
        mt_tensor_unref(masked);
        mt_tensor_unref(r);
        mt_tensor_unref(a0);
        mt_tensor_unref(bnn);
        rc = give(n, 1, r2, gi);
    }
    mt_tensor_unref(zero);
    return rc;
}

/* The weight of one input's gradient in maximum/minimum, as torch: 1 - [it lost] - [tie] / 2,
   where `lost` compares it with the other input. Ties split the gradient; a NaN operand
   makes every comparison false, so both inputs get the whole gradient (torch does too). */
static mt_tensor *minmax_weight(mt_tensor *lost, mt_tensor *tie, mt_dtype dt) {
    mt_tensor *lf = lost ? mt_cast(lost, dt) : NULL, *tf = tie ? mt_cast(tie, dt) : NULL;
    mt_tensor *half = tf ? mt_mul_scalar(tf, 0.5) : NULL;
    mt_tensor *sum = lf && half ? mt_add(lf, half) : NULL;
    mt_tensor *w = sum ? mt_rsub_scalar(sum, 1.0) : NULL;
    mt_tensor_unref(lf);
    mt_tensor_unref(tf);
    mt_tensor_unref(half);
    mt_tensor_unref(sum);
    return w;
}

static int minmax_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    mt_tensor *a = n->saved[0], *b = n->saved[1];
    bool is_max = n->op == MT_OP_MAXIMUM;
    mt_tensor *tie = mt_eq(a, b);
    int rc = 0;
    for (int i = 0; i < 2 && rc == 0; i++) {
        if (!mt_node_needs(n, i)) continue;
        /* input i lost when it is below (max) or above (min) the other */
        mt_tensor *x = i == 0 ? a : b, *y = i == 0 ? b : a;
        mt_tensor *lost = is_max ? mt_lt(x, y) : mt_gt(x, y);
        mt_tensor *w = minmax_weight(lost, tie, g->dtype);
        mt_tensor_unref(lost);
        rc = give(n, i, w ? mt_mul(g, w) : NULL, gi);
        mt_tensor_unref(w);
    }
    mt_tensor_unref(tie);
    return rc;
}

static int neg_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    return give(n, 0, mt_neg(g), gi);
}
static int exp_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    return give(n, 0, mt_mul(g, n->saved[0]), gi); /* saved output */
}
static int log_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    return give(n, 0, mt_div(g, n->saved[0]), gi); /* saved input */
}
static int sqrt_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    mt_tensor *h = mt_mul_scalar(g, 0.5);
    int rc = give(n, 0, h ? mt_div(h, n->saved[0]) : NULL, gi); /* saved output */
    mt_tensor_unref(h);
    return rc;
}
static int rsqrt_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    mt_tensor *y3 = mt_pow_scalar(n->saved[0], 3.0), *d = y3 ? mt_mul_scalar(y3, -0.5) : NULL;
    mt_tensor_unref(y3);
    int rc = give(n, 0, d ? mt_mul(g, d) : NULL, gi);
    mt_tensor_unref(d);
    return rc;
}
static int abs_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    mt_tensor *s = mt_unary_op_internal(MT_OP_SIGN, n->saved[0], 0);
    int rc = give(n, 0, s ? mt_mul(g, s) : NULL, gi);
    mt_tensor_unref(s);
    return rc;
}
static int sign_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    return give(n, 0, mt_zeros_like(g), gi);
}
/* ops with a fused backward kernel (ops.def): one pass from the gradient and the saved tensor */
static int fused_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    mt_op_id bw = (mt_op_id)mt_op_fused_backward(n->op);
    return give(n, 0, mt_binary_op_internal(bw, g, n->saved[0]), gi);
}
static int add_scalar_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    return give(n, 0, mt_tensor_ref(g), gi);
}
static int mul_scalar_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    return give(n, 0, mt_mul_scalar(g, n->scalars[0]), gi);
}
static int rsub_scalar_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    return give(n, 0, mt_neg(g), gi);
}
static int rdiv_scalar_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    /* d(s/x)/dx = -s/x^2 = -y/x; saved x and y */
    mt_tensor *q = mt_div(n->saved[1], n->saved[0]), *r = q ? mt_mul(g, q) : NULL;
    mt_tensor_unref(q);
    int rc = give(n, 0, r ? mt_neg(r) : NULL, gi);
    mt_tensor_unref(r);
    return rc;
}
static int pow_scalar_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    double s = n->scalars[0];
    if (s == 0.0) return give(n, 0, mt_zeros_like(g), gi); /* x^0: 0 everywhere, x = 0 too */
    mt_tensor *p = s == 2.0 ? mt_tensor_ref(n->saved[0]) : mt_pow_scalar(n->saved[0], s - 1.0);
    mt_tensor *d = p ? mt_mul_scalar(p, s) : NULL;
    mt_tensor_unref(p);
    int rc = give(n, 0, d ? mt_mul(g, d) : NULL, gi);
    mt_tensor_unref(d);
    return rc;
}
static int where_backward(mt_node *n, mt_tensor *g, mt_tensor **gi) {
    mt_tensor *cond = n->saved[0];
    mt_tensor *zero = mt_zeros(0, NULL, g->dtype, g->device);
    if (!zero) return mt_backward_failed();
    int rc = mt_node_needs(n, 1) ? give(n, 1, mt_where(cond, g, zero), gi) : 0;
    if (rc == 0 && mt_node_needs(n, 2)) rc = give(n, 2, mt_where(cond, zero, g), gi);
    mt_tensor_unref(zero);
    return rc;
}

/* ------------------------------------------------------------------ entry paths */

/* Type promotion and autocast (mt_dispatch_inputs). The common case, autocast off and every
   floating input already in the compute dtype, casts nothing: the inputs are used as they
   are, borrowed (*owned false), which saves a retain/release pair per input per call. */
static int dispatch(mt_op_id op, mt_tensor *const *in, int n, mt_tensor **c, bool *owned) {
    if (!mt_autocast_active()) {
        mt_dtype widest = MT_DTYPE_COUNT;
        bool same = true;
        for (int i = 0; i < n; i++) {
            if (!mt_dtype_is_floating(in[i]->dtype)) continue;
            if (widest == MT_DTYPE_COUNT)
                widest = in[i]->dtype;
            else
                same = same && in[i]->dtype == widest;
        }
        if (same) {
            for (int i = 0; i < n; i++) c[i] = in[i];
            *owned = false;
            return widest != MT_DTYPE_COUNT ? (int)widest : (int)in[0]->dtype;
        }
    }
    *owned = true;
    return mt_dispatch_inputs(op, in, n, c);
}

static void dispatch_release(mt_tensor **c, int n, bool owned) {
    if (owned) mt_dispatch_release(c, n);
}

static bool is_compare(mt_op_id op) {
    return op >= MT_OP_EQ && op <= MT_OP_GE;
}

static mt_backward_fn binary_backward_fn(mt_op_id op) {
    switch (op) {
    case MT_OP_ADD:
        return add_backward;
    case MT_OP_SUB:
        return sub_backward;
    case MT_OP_MUL:
        return mul_backward;
    case MT_OP_DIV:
        return div_backward;
    case MT_OP_POW:
        return pow_backward;
    case MT_OP_MAXIMUM:
    case MT_OP_MINIMUM:
        return minmax_backward;
    default:
        return NULL; /* comparisons and backward kernels */
    }
}

static mt_tensor *binary_same_device(mt_op_id op, mt_tensor *a, mt_tensor *b) {
    const char *name = mt_op_fullname(op);
    bool cmp = is_compare(op);
    if (!cmp && (mt_check_floating(name, 1, a) < 0 || mt_check_floating(name, 2, b) < 0))
        return NULL;
    if (cmp && mt_dtype_is_floating(a->dtype) != mt_dtype_is_floating(b->dtype)) {
        mt_error_set(MT_ERR_DTYPE, "%s: cannot compare %s with %s", name, mt_dtype_name(a->dtype),
                     mt_dtype_name(b->dtype));
        return NULL;
    }
    if (cmp && !mt_dtype_is_floating(a->dtype) && a->dtype != b->dtype) {
        mt_error_set(MT_ERR_DTYPE, "%s: cannot compare %s with %s (cast one first)", name,
                     mt_dtype_name(a->dtype), mt_dtype_name(b->dtype));
        return NULL;
    }
    if (mt_check_same_device(name, a, b) < 0) return NULL;
    int nd;
    int64_t shape[MT_MAX_DIMS];
    if (mt_broadcast_shapes(name, a->ndim, a->shape, b->ndim, b->shape, &nd, shape) < 0)
        return NULL;
    mt_tensor *in[2] = {a, b}, *c[2];
    bool owned;
    int compute = dispatch(op, in, 2, c, &owned);
    if (compute < 0) return NULL;
    mt_tensor *out = mt_tensor_new_like(name, nd, shape, cmp ? MT_BOOL : (mt_dtype)compute,
                                        a->device, (const mt_tensor *const *)c, 2);
    /* inputs that already have the output's shape go to the kernel as they are */
    mt_tensor *ea = NULL, *eb = NULL;
    int rc = out ? 0 : MT_ERR_OOM;
    if (rc == 0 && !mt_same_shape(c[0], out) && !(ea = mt_tensor_expand_to(c[0], nd, shape)))
        rc = MT_ERR_OOM;
    if (rc == 0 && !mt_same_shape(c[1], out) && !(eb = mt_tensor_expand_to(c[1], nd, shape)))
        rc = MT_ERR_OOM;
    if (rc == 0) rc = mt_backend_get(a->device)->binary(op, out, ea ? ea : c[0], eb ? eb : c[1]);
    mt_tensor_unref(ea);
    mt_tensor_unref(eb);
    mt_backward_fn bw = binary_backward_fn(op);
    if (rc == 0 && bw) {
        mt_node *node = mt_record(op, bw, c, 2, out, &rc);
        mt_op_saves saves = mt_op_saved(op);
        if (node && saves != MT_SAVES_NOTHING) {
            rc = mt_node_save(node, 0, c[0]);
            if (!rc) rc = mt_node_save(node, 1, c[1]);
            if (!rc && saves == MT_SAVES_INPUTS_OUTPUT) rc = mt_node_save(node, 2, out);
        }
    }
    if (rc) {
        mt_tensor_unref(out);
        out = NULL;
    }
    mt_dispatch_done(op, (mt_dtype)compute, out, in, 2);
    dispatch_release(c, 2, owned);
    return out;
}

/* A 0-d CPU tensor meets a CUDA tensor as torch lets it (x * torch.tensor(0.5)): it is
   uploaded first, through mt_to, so that its gradient flows back to the CPU. The upload is
   asynchronous (no host wait); any other device mix is an error. */
static bool cpu_scalar_for(const mt_tensor *s, const mt_tensor *other) {
    return s->ndim == 0 && s->device.type == MT_DEVICE_CPU && other->device.type == MT_DEVICE_CUDA;
}

mt_tensor *mt_binary_op_internal(mt_op_id op, mt_tensor *a, mt_tensor *b) {
    mt_tensor *moved = NULL;
    if (cpu_scalar_for(a, b))
        a = moved = mt_to(a, b->device);
    else if (cpu_scalar_for(b, a))
        b = moved = mt_to(b, a->device);
    else
        return binary_same_device(op, a, b);
    mt_tensor *out = moved ? binary_same_device(op, a, b) : NULL;
    mt_tensor_unref(moved);
    return out;
}

static mt_backward_fn unary_backward_fn(mt_op_id op) {
    if (mt_op_fused_backward(op) != MT_OP_NONE) return fused_backward;
    switch (op) {
    case MT_OP_NEG:
        return neg_backward;
    case MT_OP_EXP:
        return exp_backward;
    case MT_OP_LOG:
        return log_backward;
    case MT_OP_SQRT:
        return sqrt_backward;
    case MT_OP_RSQRT:
        return rsqrt_backward;
    case MT_OP_ABS:
        return abs_backward;
    case MT_OP_SIGN:
        return sign_backward;
    case MT_OP_ADD_SCALAR:
        return add_scalar_backward;
    case MT_OP_MUL_SCALAR:
        return mul_scalar_backward;
    case MT_OP_RSUB_SCALAR:
        return rsub_scalar_backward;
    case MT_OP_RDIV_SCALAR:
        return rdiv_scalar_backward;
    case MT_OP_POW_SCALAR:
        return pow_scalar_backward;
    default:
        return NULL;
    }
}

mt_tensor *mt_unary_op_internal(mt_op_id op, mt_tensor *a, double p) {
    const char *name = mt_op_fullname(op);
    if (mt_check_floating(name, 1, a) < 0) return NULL;
    mt_tensor *c;
    bool owned;
    int compute = dispatch(op, &a, 1, &c, &owned);
    if (compute < 0) return NULL;
    mt_tensor *out = mt_tensor_new_like(name, c->ndim, c->shape, (mt_dtype)compute, a->device,
                                        (const mt_tensor *const *)&c, 1);
    int rc = out ? mt_backend_get(a->device)->unary(op, out, c, p) : MT_ERR_OOM;
    mt_backward_fn bw = unary_backward_fn(op);
    if (rc == 0 && bw) {
        mt_node *node = mt_record(op, bw, &c, 1, out, &rc);
        if (node) {
            node->scalars[0] = p;
            mt_op_saves saves = mt_op_saved(op);
            if (saves == MT_SAVES_OUTPUT) rc = mt_node_save(node, 0, out);
            if (saves == MT_SAVES_INPUT || saves == MT_SAVES_INPUT_OUTPUT)
                rc = mt_node_save(node, 0, c);
            if (saves == MT_SAVES_INPUT_OUTPUT && !rc) rc = mt_node_save(node, 1, out);
        }
    }
    if (rc) {
        mt_tensor_unref(out);
        out = NULL;
    }
    mt_dispatch_done(op, (mt_dtype)compute, out, &a, 1);
    dispatch_release(&c, 1, owned);
    return out;
}

/* ------------------------------------------------------------------ public API */

#define BINARY_API(fn, OP)                                                                         \
    mt_tensor *fn(mt_tensor *a, mt_tensor *b) {                                                    \
        if (!a || !b) return NULL;                                                                 \
        mt_api_enter();                                                                            \
        return mt_api_exit(mt_binary_op_internal(OP, a, b));                                       \
    }
BINARY_API(mt_add, MT_OP_ADD)
BINARY_API(mt_sub, MT_OP_SUB)
BINARY_API(mt_mul, MT_OP_MUL)
BINARY_API(mt_div, MT_OP_DIV)
BINARY_API(mt_pow, MT_OP_POW)
BINARY_API(mt_maximum, MT_OP_MAXIMUM)
BINARY_API(mt_minimum, MT_OP_MINIMUM)
BINARY_API(mt_eq, MT_OP_EQ)
BINARY_API(mt_ne, MT_OP_NE)
BINARY_API(mt_lt, MT_OP_LT)
BINARY_API(mt_le, MT_OP_LE)
BINARY_API(mt_gt, MT_OP_GT)
BINARY_API(mt_ge, MT_OP_GE)

#define SCALAR_API(fn, OP)                                                                         \
    mt_tensor *fn(mt_tensor *a, double s) {                                                        \
        if (!a) return NULL;                                                                       \
        mt_api_enter();                                                                            \
        return mt_api_exit(mt_unary_op_internal(OP, a, s));                                        \
    }
SCALAR_API(mt_add_scalar, MT_OP_ADD_SCALAR)
SCALAR_API(mt_mul_scalar, MT_OP_MUL_SCALAR)
SCALAR_API(mt_pow_scalar, MT_OP_POW_SCALAR)
SCALAR_API(mt_rsub_scalar, MT_OP_RSUB_SCALAR)
SCALAR_API(mt_rdiv_scalar, MT_OP_RDIV_SCALAR)

#define UNARY_API(fn, OP)                                                                          \
    mt_tensor *fn(mt_tensor *a) {                                                                  \
        if (!a) return NULL;                                                                       \
        mt_api_enter();                                                                            \
        return mt_api_exit(mt_unary_op_internal(OP, a, 0));                                        \
    }
UNARY_API(mt_neg, MT_OP_NEG)
UNARY_API(mt_exp, MT_OP_EXP)
UNARY_API(mt_log, MT_OP_LOG)
UNARY_API(mt_sqrt, MT_OP_SQRT)
UNARY_API(mt_rsqrt, MT_OP_RSQRT)
UNARY_API(mt_abs, MT_OP_ABS)
UNARY_API(mt_relu, MT_OP_RELU)
UNARY_API(mt_gelu, MT_OP_GELU)
UNARY_API(mt_gelu_tanh, MT_OP_GELU_TANH)
UNARY_API(mt_sigmoid, MT_OP_SIGMOID)
UNARY_API(mt_tanh, MT_OP_TANH)

mt_tensor *mt_where(mt_tensor *cond, mt_tensor *a, mt_tensor *b) {
    if (!cond || !a || !b) return NULL;
    mt_api_enter();
    const char *name = "mt_where";
    if (cond->dtype != MT_BOOL) {
        mt_error_set(MT_ERR_DTYPE, "mt_where: arg 1: condition must be bool, got %s",
                     mt_dtype_name(cond->dtype));
        return mt_api_exit(NULL);
    }
    if (mt_check_floating(name, 2, a) < 0 || mt_check_floating(name, 3, b) < 0 ||
        mt_check_same_device(name, cond, a) < 0 || mt_check_same_device(name, a, b) < 0)
        return mt_api_exit(NULL);
    int nd, nd2;
    int64_t s1[MT_MAX_DIMS], shape[MT_MAX_DIMS];
    if (mt_broadcast_shapes(name, a->ndim, a->shape, b->ndim, b->shape, &nd, s1) < 0 ||
        mt_broadcast_shapes(name, cond->ndim, cond->shape, nd, s1, &nd2, shape) < 0)
        return mt_api_exit(NULL);
    mt_tensor *in[3] = {cond, a, b}, *c[3];
    bool owned;
    int compute = dispatch(MT_OP_WHERE, in, 3, c, &owned);
    if (compute < 0) return mt_api_exit(NULL);
    mt_tensor *out = mt_tensor_new_like(name, nd2, shape, (mt_dtype)compute, a->device,
                                        (const mt_tensor *const *)c, 3);
    mt_tensor *e[3] = {0};
    int rc = out ? 0 : MT_ERR_OOM;
    for (int i = 0; i < 3 && rc == 0; i++)
        if (!(e[i] = mt_tensor_expand_to(c[i], nd2, shape))) rc = MT_ERR_OOM;
    if (rc == 0) rc = mt_backend_get(a->device)->where(out, e[0], e[1], e[2]);
    for (int i = 0; i < 3; i++) mt_tensor_unref(e[i]);
    if (rc == 0) {
        mt_node *node = mt_record(MT_OP_WHERE, where_backward, c, 3, out, &rc);
        if (node) rc = mt_node_save(node, 0, c[0]);
    }
    if (rc) {
        mt_tensor_unref(out);
        out = NULL;
    }
    mt_dispatch_done(MT_OP_WHERE, (mt_dtype)compute, out, in, 3);
    dispatch_release(c, 3, owned);
    return mt_api_exit(out);
}
