/* Golden values from PyTorch (tools/gen_golden.py -> test/golden/<op>.txt): every case builds
   the stored inputs, runs the mixtape op, compares the output, then seeds mt_backward with the
   stored cotangent and compares the gradient of every differentiable input. One cmocka test
   per op file; a failure lists every failing case with the element and both values. */
#include "golden_reader.h"
#include "test_util.h"

#ifndef MT_GOLDEN_DIR
#error "MT_GOLDEN_DIR must name the directory of the golden files (test/meson.build sets it)"
#endif

/* ------------------------------------------------------------------ adapters */

typedef mt_tensor *(*golden_fn)(mt_tensor *const *in, int n, const golden_case *c);

/* Why an adapter returned NULL without calling mixtape (bad golden data), for the report. */
static _Thread_local char adapter_err[160];

static const golden_param *param(const golden_case *c, const char *key, int n) {
    const golden_param *p = golden_param_get(c, key);
    if (!p || (n >= 0 && p->n != n)) {
        snprintf(adapter_err, sizeof adapter_err, "golden data: param \"%s\" missing or malformed",
                 key);
        return NULL;
    }
    return p;
}
static bool param_int(const golden_case *c, const char *key, int *out) {
    const golden_param *p = param(c, key, 1);
    if (p) *out = (int)p->v[0];
    return p != NULL;
}
static bool param_i64(const golden_case *c, const char *key, int64_t *out) {
    const golden_param *p = param(c, key, 1);
    if (p) *out = (int64_t)p->v[0];
    return p != NULL;
}
static bool need_inputs(int n, int want) {
    if (n == want) return true;
    snprintf(adapter_err, sizeof adapter_err, "golden data: %d inputs, the op takes %d", n, want);
    return false;
}

#define BINARY(op)                                                                                 \
    static mt_tensor *g_##op(mt_tensor *const *in, int n, const golden_case *c) {                  \
        (void)c;                                                                                   \
        return need_inputs(n, 2) ? mt_##op(in[0], in[1]) : NULL;                                   \
    }
#define UNARY(op)                                                                                  \
    static mt_tensor *g_##op(mt_tensor *const *in, int n, const golden_case *c) {                  \
        (void)c;                                                                                   \
        return need_inputs(n, 1) ? mt_##op(in[0]) : NULL;                                          \
    }
#define WITH_SCALAR(op)                                                                            \
    static mt_tensor *g_##op(mt_tensor *const *in, int n, const golden_case *c) {                  \
        const golden_param *p = param(c, "s", 1);                                                  \
        return p && need_inputs(n, 1) ? mt_##op(in[0], p->v[0]) : NULL;                            \
    }
#define REDUCE(op)                                                                                 \
    static mt_tensor *g_##op(mt_tensor *const *in, int n, const golden_case *c) {                  \
        const golden_param *d = param(c, "dims", -1);                                              \
        int keep = 0, dims[MT_MAX_DIMS];                                                           \
        if (!d || !param_int(c, "keepdim", &keep) || !need_inputs(n, 1)) return NULL;              \
        for (int i = 0; i < d->n; i++) dims[i] = (int)d->v[i];                                     \
        return mt_##op(in[0], d->n, dims, keep != 0);                                              \
    }
#define DIM_OP(op)                                                                                 \
    static mt_tensor *g_##op(mt_tensor *const *in, int n, const golden_case *c) {                  \
        int dim;                                                                                   \
        return param_int(c, "dim", &dim) && need_inputs(n, 1) ? mt_##op(in[0], dim) : NULL;        \
    }
#define SHAPE_OP(op)                                                                               \
    static mt_tensor *g_##op(mt_tensor *const *in, int n, const golden_case *c) {                  \
        const golden_param *s = param(c, "shape", -1);                                             \
        int64_t shape[MT_MAX_DIMS];                                                                \
        if (!s || !need_inputs(n, 1)) return NULL;                                                 \
        for (int i = 0; i < s->n; i++) shape[i] = (int64_t)s->v[i];                                \
        return mt_##op(in[0], s->n, shape);                                                        \
    }
#define LIST_OP(op)                                                                                \
    static mt_tensor *g_##op(mt_tensor *const *in, int n, const golden_case *c) {                  \
        int dim;                                                                                   \
        return param_int(c, "dim", &dim) ? mt_##op(in, n, dim) : NULL;                             \
    }

BINARY(add)
BINARY(sub)
BINARY(mul)
BINARY(div)
BINARY(pow)
BINARY(maximum)
BINARY(minimum)
BINARY(eq)
BINARY(ne)
BINARY(lt)
BINARY(le)
BINARY(gt)
BINARY(ge)
BINARY(matmul)
BINARY(mse_loss)
WITH_SCALAR(add_scalar)
WITH_SCALAR(mul_scalar)
WITH_SCALAR(pow_scalar)
WITH_SCALAR(rsub_scalar)
WITH_SCALAR(rdiv_scalar)
UNARY(neg)
UNARY(exp)
UNARY(log)
UNARY(sqrt)
UNARY(rsqrt)
UNARY(abs)
UNARY(relu)
UNARY(gelu)
UNARY(gelu_tanh)
UNARY(sigmoid)
UNARY(tanh)
UNARY(sum_all)
UNARY(mean_all)
UNARY(max_all)
REDUCE(sum)
REDUCE(mean)
REDUCE(max)
DIM_OP(softmax)
DIM_OP(log_softmax)
DIM_OP(squeeze)
DIM_OP(unsqueeze)
SHAPE_OP(reshape)
SHAPE_OP(expand)
SHAPE_OP(view)
UNARY(flatten)
UNARY(clone)
UNARY(contiguous)
UNARY(detach)
LIST_OP(cat)
LIST_OP(stack)

static mt_tensor *g_where(mt_tensor *const *in, int n, const golden_case *c) {
    (void)c;
    return need_inputs(n, 3) ? mt_where(in[0], in[1], in[2]) : NULL;
}
static mt_tensor *g_linear(mt_tensor *const *in, int n, const golden_case *c) {
    (void)c;
    if (n != 2 && !need_inputs(n, 3)) return NULL;
    return mt_linear(in[0], in[1], n == 3 ? in[2] : NULL);
}
static mt_tensor *g_linear_act(mt_tensor *const *in, int n, const golden_case *c) {
    int act;
    if ((n != 2 && !need_inputs(n, 3)) || !param_int(c, "act", &act)) return NULL;
    return mt_linear_act(in[0], in[1], n == 3 ? in[2] : NULL, (mt_activation)act);
}
/* A pair param ("stride" 2 a b) into a[2]; false (reported) when missing. */
static bool param_pair(const golden_case *c, const char *key, int64_t *a) {
    const golden_param *p = param(c, key, 2);
    if (p) a[0] = (int64_t)p->v[0], a[1] = (int64_t)p->v[1];
    return p != NULL;
}
/* The output must keep a channels-last input's memory format. */
static mt_tensor *keeps_format(mt_tensor *x, mt_tensor *out) {
    if (out && mt_is_channels_last(x) && !mt_is_contiguous(x) && !mt_is_channels_last(out)) {
        snprintf(adapter_err, sizeof adapter_err, "a channels-last input gave an NCHW output");
        mt_release(out);
        return NULL;
    }
    return out;
}
static mt_tensor *g_conv2d(mt_tensor *const *in, int n, const golden_case *c) {
    mt_conv2d_opts o = {0};
    if (n != 2 && !need_inputs(n, 3)) return NULL;
    if (!param_pair(c, "stride", o.stride) || !param_pair(c, "padding", o.padding) ||
        !param_pair(c, "dilation", o.dilation) || !param_i64(c, "groups", &o.groups))
        return NULL;
    return keeps_format(in[0], mt_conv2d(in[0], in[1], n == 3 ? in[2] : NULL, &o));
}
static bool pool_opts(const golden_case *c, mt_pool2d_opts *o) {
    int ceil, incl;
    if (!param_pair(c, "kernel", o->kernel) || !param_pair(c, "stride", o->stride) ||
        !param_pair(c, "padding", o->padding) || !param_int(c, "ceil_mode", &ceil) ||
        !param_int(c, "count_include_pad", &incl))
        return false;
    o->ceil_mode = ceil != 0;
    o->exclude_pad = incl == 0;
    return true;
}
static mt_tensor *g_max_pool2d(mt_tensor *const *in, int n, const golden_case *c) {
    mt_pool2d_opts o = {0};
    if (!need_inputs(n, 1) || !pool_opts(c, &o)) return NULL;
    return keeps_format(in[0], mt_max_pool2d(in[0], &o));
}
static mt_tensor *g_avg_pool2d(mt_tensor *const *in, int n, const golden_case *c) {
    mt_pool2d_opts o = {0};
    if (!need_inputs(n, 1) || !pool_opts(c, &o)) return NULL;
    return keeps_format(in[0], mt_avg_pool2d(in[0], &o));
}
static mt_tensor *g_adaptive_avg_pool2d(mt_tensor *const *in, int n, const golden_case *c) {
    int64_t size[2];
    if (!need_inputs(n, 1) || !param_pair(c, "output_size", size)) return NULL;
    return keeps_format(in[0], mt_adaptive_avg_pool2d(in[0], size[0], size[1]));
}
static mt_tensor *g_cross_entropy(mt_tensor *const *in, int n, const golden_case *c) {
    if (!need_inputs(n, 2)) return NULL;
    if (!golden_param_get(c, "ignore_index")) return mt_cross_entropy(in[0], in[1]);
    int64_t ignore;
    return param_i64(c, "ignore_index", &ignore) ? mt_cross_entropy_ex(in[0], in[1], ignore) : NULL;
}
static mt_tensor *g_cast(mt_tensor *const *in, int n, const golden_case *c) {
    if (c->target == MT_DTYPE_COUNT) {
        snprintf(adapter_err, sizeof adapter_err, "golden data: cast without a target");
        return NULL;
    }
    return need_inputs(n, 1) ? mt_cast(in[0], c->target) : NULL;
}
static mt_tensor *g_transpose(mt_tensor *const *in, int n, const golden_case *c) {
    int d0, d1;
    if (!param_int(c, "d0", &d0) || !param_int(c, "d1", &d1) || !need_inputs(n, 1)) return NULL;
    return mt_transpose(in[0], d0, d1);
}
static mt_tensor *g_permute(mt_tensor *const *in, int n, const golden_case *c) {
    const golden_param *o = param(c, "order", -1);
    int order[MT_MAX_DIMS];
    if (!o || !need_inputs(n, 1)) return NULL;
    for (int i = 0; i < o->n; i++) order[i] = (int)o->v[i];
    return mt_permute(in[0], o->n, order);
}
static mt_tensor *g_narrow(mt_tensor *const *in, int n, const golden_case *c) {
    int dim;
    int64_t start, length;
    if (!param_int(c, "dim", &dim) || !param_i64(c, "start", &start) ||
        !param_i64(c, "length", &length) || !need_inputs(n, 1))
        return NULL;
    return mt_narrow(in[0], dim, start, length);
}
static mt_tensor *g_slice(mt_tensor *const *in, int n, const golden_case *c) {
    int dim;
    int64_t start, end, step;
    if (!param_int(c, "dim", &dim) || !param_i64(c, "start", &start) ||
        !param_i64(c, "end", &end) || !param_i64(c, "step", &step) || !need_inputs(n, 1))
        return NULL;
    return mt_slice(in[0], dim, start, end, step);
}

static mt_tensor *g_to(mt_tensor *const *in, int n, const golden_case *c) {
    (void)c;
    /* torch's x.to("cpu") of a CPU tensor: a move to the tensor's own device */
    return need_inputs(n, 1) ? mt_to(in[0], mt_test_device()) : NULL;
}

/* ---- nn ops of issue 9 */
static double param_or(const golden_case *c, const char *key, double dflt) {
    const golden_param *p = golden_param_get(c, key);
    return p && p->n == 1 ? p->v[0] : dflt;
}
static mt_tensor *g_layer_norm(mt_tensor *const *in, int n, const golden_case *c) {
    int nd;
    if (!param_int(c, "normalized_ndim", &nd) || (n != 1 && !need_inputs(n, 3))) return NULL;
    return mt_layer_norm(in[0], nd, n == 3 ? in[1] : NULL, n == 3 ? in[2] : NULL,
                         param_or(c, "eps", 1e-5));
}
/* inputs: x, running_mean, running_var, weight, bias[, residual] */
static mt_tensor *bn_call(mt_tensor *const *in, const golden_case *c, bool act) {
    int training;
    if (!param_int(c, "training", &training)) return NULL;
    double mom = param_or(c, "momentum", 0.1), eps = param_or(c, "eps", 1e-5);
    if (!act) return mt_batch_norm(in[0], in[1], in[2], in[3], in[4], training != 0, mom, eps);
    return mt_batch_norm_act(in[0], in[1], in[2], in[3], in[4], in[5], training != 0, mom, eps,
                             MT_ACT_RELU);
}
static mt_tensor *g_batch_norm(mt_tensor *const *in, int n, const golden_case *c) {
    return need_inputs(n, 5) ? bn_call(in, c, false) : NULL;
}
static mt_tensor *g_batch_norm_act(mt_tensor *const *in, int n, const golden_case *c) {
    return need_inputs(n, 6) ? bn_call(in, c, true) : NULL;
}
/* the running statistics after one call, stacked as [2, C] */
static mt_tensor *g_batch_norm_stats(mt_tensor *const *in, int n, const golden_case *c) {
    if (!need_inputs(n, 5)) return NULL;
    mt_tensor *y = bn_call(in, c, false);
    if (!y) return NULL;
    mt_release(y);
    return mt_stack((mt_tensor *[]){in[1], in[2]}, 2, 0);
}
static mt_tensor *g_embedding(mt_tensor *const *in, int n, const golden_case *c) {
    (void)c;
    return need_inputs(n, 2) ? mt_embedding(in[0], in[1]) : NULL;
}
static mt_tensor *g_index_select(mt_tensor *const *in, int n, const golden_case *c) {
    int dim;
    return param_int(c, "dim", &dim) && need_inputs(n, 2) ? mt_index_select(in[0], dim, in[1])
                                                          : NULL;
}
static mt_tensor *g_gather(mt_tensor *const *in, int n, const golden_case *c) {
    int dim;
    return param_int(c, "dim", &dim) && need_inputs(n, 2) ? mt_gather(in[0], dim, in[1]) : NULL;
}
static mt_tensor *g_argmax(mt_tensor *const *in, int n, const golden_case *c) {
    int dim, keep;
    if (!param_int(c, "dim", &dim) || !param_int(c, "keepdim", &keep) || !need_inputs(n, 1))
        return NULL;
    return mt_argmax(in[0], dim, keep != 0);
}

/* In-place ops: applied to input 0, which run_case built fresh from the golden data for this
   case (a non-contiguous view of its own leaf for "transposed" cases, so strided destinations
   are covered); the result is that tensor. */
static mt_tensor *inplace_result(mt_tensor *dst, int status) {
    return status == 0 ? mt_retain(dst) : NULL;
}
static mt_tensor *g_fill(mt_tensor *const *in, int n, const golden_case *c) {
    const golden_param *p = param(c, "value", 1);
    return p && need_inputs(n, 1) ? inplace_result(in[0], mt_fill(in[0], p->v[0])) : NULL;
}
static mt_tensor *g_zero(mt_tensor *const *in, int n, const golden_case *c) {
    (void)c;
    return need_inputs(n, 1) ? inplace_result(in[0], mt_zero(in[0])) : NULL;
}
static mt_tensor *g_copy(mt_tensor *const *in, int n, const golden_case *c) {
    (void)c;
    return need_inputs(n, 2) ? inplace_result(in[0], mt_copy(in[0], in[1])) : NULL;
}
static mt_tensor *g_add_inplace(mt_tensor *const *in, int n, const golden_case *c) {
    (void)c;
    return need_inputs(n, 2) ? inplace_result(in[0], mt_add_inplace(in[0], in[1])) : NULL;
}
static mt_tensor *g_mul_scalar_inplace(mt_tensor *const *in, int n, const golden_case *c) {
    const golden_param *p = param(c, "s", 1);
    return p && need_inputs(n, 1) ? inplace_result(in[0], mt_mul_scalar_inplace(in[0], p->v[0]))
                                  : NULL;
}

/* exact: the forward result involves no rounding (selection, layout, comparisons, casts),
   so it must match bit for bit; gradients still get the dtype's tolerance (expand and
   broadcasting sum them).
   bias_after_round: a third input is a per-channel bias [C] of an [N, C, ...] output, which a
   real GPU adds after the rest of the result was rounded to an F16/BF16 output (see
   bias_rounding_applies). */
typedef struct {
    const char *op;
    golden_fn fn;
    bool exact;
    const char *cpu_only; /* why other devices skip it (no kernels there yet), or NULL */
    bool bias_after_round;
} golden_op;

#define OP(name, exact)                                                                            \
    { #name, g_##name, exact, NULL, false }
#define OP_CPU(name, exact, why)                                                                   \
    { #name, g_##name, exact, why, false }
#define OP_BIAS_AFTER_ROUND(name)                                                                  \
    { #name, g_##name, false, NULL, true }

static const golden_op golden_ops[] = {
    OP(add, false),
    OP(sub, false),
    OP(mul, false),
    OP(div, false),
    OP(pow, false),
    OP(maximum, true),
    OP(minimum, true),
    OP(add_scalar, false),
    OP(mul_scalar, false),
    OP(pow_scalar, false),
    OP(rsub_scalar, false),
    OP(rdiv_scalar, false),
    OP(neg, true),
    OP(exp, false),
    OP(log, false),
    OP(sqrt, false),
    OP(rsqrt, false),
    OP(abs, true),
    OP(relu, true),
    OP(gelu, false),
    OP(gelu_tanh, false),
    OP(sigmoid, false),
    OP(tanh, false),
    OP(eq, true),
    OP(ne, true),
    OP(lt, true),
    OP(le, true),
    OP(gt, true),
    OP(ge, true),
    OP(where, true),
    OP(sum, false),
    OP(mean, false),
    OP(max, true),
    OP(sum_all, false),
    OP(mean_all, false),
    OP(max_all, true),
    OP(softmax, false),
    OP(log_softmax, false),
    OP(matmul, false),
    OP(linear, false),
    OP_BIAS_AFTER_ROUND(conv2d),
    OP(max_pool2d, true),
    OP(avg_pool2d, false),
    OP(adaptive_avg_pool2d, false),
    OP(mse_loss, false),
    OP(cross_entropy, false),
    OP(cat, true),
    OP(stack, true),
    OP(cast, true),
    OP(reshape, true),
    OP(transpose, true),
    OP(permute, true),
    OP(narrow, true),
    OP(slice, true),
    OP(expand, true),
    OP(squeeze, true),
    OP(unsqueeze, true),
    OP(view, true),
    OP(flatten, true),
    OP(clone, true),
    OP(contiguous, true),
    OP(detach, true),
    OP(to, true),
    OP(fill, true),
    OP(zero, true),
    OP(copy, true),
    OP(add_inplace, false),
    OP(mul_scalar_inplace, false),
    OP(layer_norm, false),
    OP(batch_norm, false),
    OP(batch_norm_act, false),
    OP(linear_act, false),
    OP(batch_norm_stats, false),
    OP(embedding, true),
    OP(index_select, true),
    OP(gather, true),
    OP(argmax, true),
};
#define GOLDEN_NOPS ((int)(sizeof golden_ops / sizeof golden_ops[0]))

/* ------------------------------------------------------------------ comparison */

/* Spacing of the low-precision dtype at |x| (subnormal spacing below the normal range). */
static double low_ulp(mt_dtype dt, double x) {
    int mant = dt == MT_F16 ? 10 : 7, emin = dt == MT_F16 ? -14 : -126;
    int e;
    frexp(fabs(x), &e); /* |x| in [2^(e-1), 2^e) */
    e -= 1;
    if (x == 0.0 || e < emin) e = emin;
    return ldexp(1.0, e - mant);
}

/* Allowed |got - expect| for one element: F64 ~1e-10 and F32 ~1e-5 relative, F16/BF16 `ulps`
   units in the last place; plus an absolute part scaled by the tensor's largest magnitude, for
   elements that come out of cancellation (sums, softmax gradients). */
static double tolerance(mt_dtype dt, double ulps, double expect, double scale) {
    switch (dt) {
    case MT_F64:
        return 1e-10 * fabs(expect) + 1e-12 * scale;
    case MT_F32:
        return 1e-5 * fabs(expect) + 1e-6 * scale;
    case MT_F16:
    case MT_BF16:
        return ulps * low_ulp(dt, expect) + ldexp(scale, -20);
    default:
        return 0.0; /* integers and bools */
    }
}

typedef struct {
    char *buf;
    size_t len, cap;
    int failed_cases, truncated;
} golden_report;

static void report(golden_report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report(golden_report *r, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    size_t n = strlen(line);
    if (r->len + n + 2 >= r->cap) {
        r->truncated++;
    } else {
        memcpy(r->buf + r->len, line, n);
        r->len += n;
        r->buf[r->len++] = '\n';
        r->buf[r->len] = '\0';
    }
}

static char *dims_str(int ndim, const int64_t *dims, char *buf, size_t cap) {
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && len < cap; d++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", d ? ", " : "", (long long)dims[d]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
    return buf;
}

static void index_str(const golden_tensor *g, int64_t flat, char *buf, size_t cap) {
    int64_t idx[MT_MAX_DIMS];
    for (int d = g->ndim - 1; d >= 0; d--) {
        idx[d] = g->shape[d] ? flat % g->shape[d] : 0;
        flat = g->shape[d] ? flat / g->shape[d] : 0;
    }
    dims_str(g->ndim, idx, buf, cap);
}

/* Compares t against the golden tensor; false (reported) on the first mismatch. */
/* Precision the values are compared at: exact, or `dt` (F16/BF16: `ulps` units in the last
   place), which differs from the tensor's dtype for F32 gradients computed under autocast. */
typedef struct {
    bool exact;
    mt_dtype dt;
    double ulps;
    /* when set, the per-channel bias added after a rounding of the rest: each element gets
       half an ulp of its pre-bias value (expected - bias[channel]) more */
    const golden_tensor *bias;
} golden_tol;

/* The bias of element i of g ([N, C, ...] stored in logical order, bias [C]). */
static double channel_bias(const golden_tensor *bias, const golden_tensor *g, int64_t i) {
    int64_t inner = 1;
    for (int d = 2; d < g->ndim; d++) inner *= g->shape[d];
    return bias->v[(i / inner) % g->shape[1]];
}

static bool compare(golden_report *r, const char *cname, const char *what, const mt_tensor *t,
                    const golden_tensor *g, golden_tol tl) {
    if (mt_dtype_of(t) != g->dt) {
        report(r, "%s: %s has dtype %s, expected %s", cname, what, mt_dtype_name(mt_dtype_of(t)),
               mt_dtype_name(g->dt));
        return false;
    }
    bool shape_ok = mt_ndim(t) == g->ndim;
    for (int i = 0; shape_ok && i < g->ndim; i++) shape_ok = mt_dim(t, i) == g->shape[i];
    if (!shape_ok) {
        int64_t shape[MT_MAX_DIMS];
        for (int i = 0; i < mt_ndim(t) && i < MT_MAX_DIMS; i++) shape[i] = mt_dim(t, i);
        char got[96], want[96];
        report(r, "%s: %s has shape %s, expected %s", cname, what,
               dims_str(mt_ndim(t), shape, got, sizeof got),
               dims_str(g->ndim, g->shape, want, sizeof want));
        return false;
    }
    double *v = mt_test_values(t);
    if (!v) {
        report(r, "%s: %s: cannot read values (%s)", cname, what, mt_last_error());
        mt_clear_error();
        return false;
    }
    double scale = 0.0;
    for (int64_t i = 0; i < g->n; i++)
        if (isfinite(g->v[i]) && fabs(g->v[i]) > scale) scale = fabs(g->v[i]);
    bool ok = true;
    for (int64_t i = 0; i < g->n && ok; i++) {
        double a = v[i], e = g->v[i];
        double tol = tl.exact ? 0.0 : tolerance(tl.dt, tl.ulps, e, scale);
        if (tl.bias && !tl.exact) tol += 0.5 * low_ulp(tl.dt, e - channel_bias(tl.bias, g, i));
        if (isnan(e) ? isnan(a) : isinf(e) ? a == e : fabs(a - e) <= tol) continue;
        char idx[96];
        index_str(g, i, idx, sizeof idx);
        report(r,
               "%s: %s element %lld %s is %.17g (%a), expected %.17g (%a), |diff| %.3g > tol %.3g",
               cname, what, (long long)i, idx, a, a, e, e, fabs(a - e), tol);
        ok = false;
    }
    free(v);
    return ok;
}

/* ------------------------------------------------------------------ running a case */

static mt_tensor *build(const golden_tensor *g) {
    size_t n = (size_t)(g->n ? g->n : 1);
    mt_tensor *t = NULL;
    if (mt_dtype_is_floating(g->dt)) {
        t = mt_test_tensor(g->v, g->dt, g->ndim, g->shape); /* exact: the values fit the dtype */
    } else if (g->dt == MT_I64 || g->dt == MT_I32) {
        int64_t *i64 = malloc(n * sizeof *i64);
        int32_t *i32 = malloc(n * sizeof *i32);
        for (int64_t i = 0; i64 && i32 && i < g->n; i++) {
            i64[i] = (int64_t)g->v[i];
            i32[i] = (int32_t)g->v[i];
        }
        if (i64 && i32)
            t = mt_from_data(g->dt == MT_I64 ? (void *)i64 : (void *)i32, g->dt, g->ndim, g->shape,
                             mt_test_device());
        free(i64);
        free(i32);
    } else {
        uint8_t *b = malloc(n);
        for (int64_t i = 0; b && i < g->n; i++) b[i] = g->v[i] != 0.0;
        if (b) t = mt_from_data(b, MT_BOOL, g->ndim, g->shape, mt_test_device());
        free(b);
    }
    if (t && g->requires_grad) mt_set_requires_grad(t, true);
    return t;
}

/* Runs one case; true when everything matched. */
static bool is_transposed(const golden_case *c, int i) {
    const golden_param *p = golden_param_get(c, "transposed");
    for (int k = 0; p && k < p->n; k++)
        if ((int)p->v[k] == i) return true;
    return false;
}

static bool is_channels_last(const golden_case *c, int i) {
    const golden_param *p = golden_param_get(c, "channels_last");
    for (int k = 0; p && k < p->n; k++)
        if ((int)p->v[k] == i) return true;
    return false;
}

/* Input i as the op sees it, and the leaf its gradient accumulates in: for a transposed input,
   a non-contiguous view (transpose of the last two dims) of a contiguous leaf; for a
   channels-last input, the leaf's mt_to_channels_last copy (gradients flow through it). */
static bool build_input(golden_report *r, const golden_case *c, int i, mt_tensor **in,
                        mt_tensor **leaf) {
    const golden_tensor *g = &c->in[i];
    if (is_channels_last(c, i)) {
        *leaf = build(g);
        *in = *leaf ? mt_to_channels_last(*leaf) : NULL;
    } else if (!is_transposed(c, i)) {
        *in = build(g);
        *leaf = *in ? mt_retain(*in) : NULL;
    } else if (g->ndim < 2) {
        report(r, "%s: golden data: input %d is %d-d and cannot be transposed", c->name, i,
               g->ndim);
        return false;
    } else {
        golden_tensor plain = *g;
        plain.requires_grad = false;
        mt_tensor *x = build(&plain), *xt = mt_transpose(x, -1, -2);
        *leaf = mt_contiguous(xt);
        mt_release(x);
        mt_release(xt);
        if (*leaf && g->requires_grad) mt_set_requires_grad(*leaf, true);
        *in = mt_transpose(*leaf, -1, -2);
        if (*in && mt_is_contiguous(*in) && g->shape[g->ndim - 1] > 1 &&
            g->shape[g->ndim - 2] > 1) {
            report(r, "%s: input %d should be a non-contiguous view", c->name, i);
            return false;
        }
    }
    if (!*in) report(r, "%s: cannot build input %d (%s)", c->name, i, mt_last_error());
    return *in != NULL;
}

/* Whether the output of this case is checked as round(round(op without bias) + bias), with the
   extra half ulp of the pre-bias value, rather than as PyTorch's CPU rounds it, once.
   On a real GPU, cuDNN's convolution forward computes with beta = 1 over y prefilled with the
   bias (src/cuda/conv_cudnn.c), but for some algorithms rounds the convolution to the output
   type before adding beta * y: the same double rounding as PyTorch's CUDA conv, which adds
   the bias after cudnnConvolutionForward. Measured on an H200 (cuDNN 9): the pointwise NCHW
   cases with bias in F16/BF16 and BF16 autocast came out 2 to 6 ulps off, e.g.
   conv2d_pointwise_nchw_bf16 element 23 was 0.41796875 where PyTorch's CPU gives 0.4140625.
   The CPU and the emulated device (whose fake cuDNN rounds once) keep the strict tolerance. */
static bool bias_rounding_applies(const golden_op *op, const golden_case *c) {
    const golden_tensor *o = &c->out;
    return op->bias_after_round && c->nin == 3 && (o->dt == MT_F16 || o->dt == MT_BF16) &&
           o->ndim >= 2 && c->in[2].n == o->shape[1] && !mt_test_device_is_cpu() &&
           !mt_test_emulated_device();
}

/* Runs one case; true when everything matched. */
static bool run_case(golden_report *r, const golden_op *op, const golden_case *c) {
    mt_tensor *in[GOLDEN_MAX_INPUTS] = {0}, *leaf[GOLDEN_MAX_INPUTS] = {0}, *out = NULL,
              *cot = NULL;
    bool ok = false;
    for (int i = 0; i < c->nin; i++)
        if (!build_input(r, c, i, &in[i], &leaf[i])) goto done;
    adapter_err[0] = '\0';
    if (c->autocast != MT_DTYPE_COUNT) mt_autocast_begin(c->autocast, MT_AMP_O1);
    out = op->fn(in, c->nin, c);
    if (c->autocast != MT_DTYPE_COUNT) mt_autocast_end();
    if (!out) {
        report(r, "%s: mt_%s returned NULL: %s", c->name, op->op,
               adapter_err[0]     ? adapter_err
               : mt_last_status() ? mt_last_error()
                                  : "(no error set)");
        goto done;
    }
    if (mt_last_status() != MT_OK) {
        report(r, "%s: mt_%s returned a tensor but left an error: %s", c->name, op->op,
               mt_last_error());
        goto done;
    }
    golden_tol out_tol = {op->exact, c->out.dt, 1.0, NULL};
    if (bias_rounding_applies(op, c)) out_tol.bias = &c->in[2];
    if (!compare(r, c->name, "output", out, &c->out, out_tol)) goto done;
    if (c->has_cotangent) {
        if (!(cot = build(&c->cotangent)) || mt_backward(out, cot) != 0) {
            report(r, "%s: mt_backward failed: %s", c->name, mt_last_error());
            goto done;
        }
        for (int k = 0; k < c->ngrad; k++) {
            int i = c->grad_input[k];
            char what[32];
            snprintf(what, sizeof what, "grad of input %d", i);
            mt_tensor *g = i < c->nin ? mt_grad(leaf[i]) : NULL;
            if (!g) {
                report(r, "%s: input %d has no gradient after mt_backward", c->name, i);
                goto done;
            }
            if (is_transposed(c, i)) { /* the leaf holds the transposed layout */
                mt_tensor *gt = mt_transpose(g, -1, -2);
                mt_release(g);
                if (!(g = gt)) {
                    report(r, "%s: cannot transpose grad %d: %s", c->name, i, mt_last_error());
                    goto done;
                }
            }
            /* Under autocast the F32 gradients carry low-precision values. */
            golden_tol tl = {false, c->grad[k].dt, 1.0, NULL};
            if (c->autocast != MT_DTYPE_COUNT) tl = (golden_tol){false, c->autocast, 1.0, NULL};
            bool same = compare(r, c->name, what, g, &c->grad[k], tl);
            mt_release(g);
            if (!same) goto done;
        }
    }
    ok = true;
done:
    mt_release(cot);
    mt_release(out);
    for (int i = 0; i < c->nin; i++) {
        mt_release(in[i]);
        mt_release(leaf[i]);
    }
    mt_clear_error();
    return ok;
}

static void run_golden_file(const golden_op *op) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.txt", MT_GOLDEN_DIR, op->op);
    golden_file f;
    if (golden_load(path, &f) != 0) fail_msg("%s", f.err);
    if (f.n == 0) {
        golden_free(&f);
        fail_msg("%s holds no case", path);
    }
    char buf[900] = ""; /* cmocka cuts a failure message at 1024 bytes */
    golden_report r = {buf, 0, sizeof buf, 0, 0};
    int n = f.n;
    for (int i = 0; i < f.n; i++)
        if (!run_case(&r, op, &f.cases[i])) r.failed_cases++;
    golden_free(&f);
    if (r.failed_cases)
        fail_msg("mt_%s: %d of %d golden cases failed:\n%s%s", op->op, r.failed_cases, n, r.buf,
                 r.truncated ? "(more failing cases left out)\n" : "");
}

/* ------------------------------------------------------------------ tests */

typedef struct {
    const golden_op *op;
    void *live; /* the MT_TEST fixture's state */
} golden_state;

static int golden_setup(void **state) {
    golden_state *s = *state;
    return mt_test_setup(&s->live);
}
static int golden_teardown(void **state) {
    golden_state *s = *state;
    return mt_test_teardown(&s->live);
}
static void golden_test(void **state) {
    golden_state *s = *state;
    run_golden_file(s->op);
}

/* Every op the generator wrote (INDEX) has an adapter here, and every op of the table a file. */
static void test_golden_index(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/INDEX", MT_GOLDEN_DIR);
    FILE *fp = fopen(path, "r");
    if (!fp) fail_msg("cannot open %s", path);
    char line[128];
    bool seen[GOLDEN_NOPS] = {0};
    while (fgets(line, sizeof line, fp)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (!line[0] || line[0] == '#') continue;
        int k = 0;
        while (k < GOLDEN_NOPS && strcmp(golden_ops[k].op, line) != 0) k++;
        if (k == GOLDEN_NOPS) {
            fclose(fp);
            fail_msg("golden op \"%s\" (in %s) has no adapter in test_golden.c", line, path);
        }
        seen[k] = true;
    }
    fclose(fp);
    for (int k = 0; k < GOLDEN_NOPS; k++)
        if (!seen[k]) fail_msg("op \"%s\" has an adapter but no golden file", golden_ops[k].op);
}

/* The loader rejects malformed data with a message naming the line. */
static void test_golden_reader_errors(void **state) {
    (void)state;
    char path[] = "/tmp/mt_golden_bad_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *fp = fdopen(fd, "w");
    assert_non_null(fp);
    fputs("# comment\ncase x\ninput f32 1 1 2 0x1p+0\nend\n", fp); /* one value short */
    fclose(fp);
    golden_file f;
    assert_int_equal(golden_load(path, &f), -1);
    assert_non_null(strstr(f.err, "malformed"));
    remove(path);
    assert_int_equal(golden_load("/nonexistent/golden.txt", &f), -1);
    assert_non_null(strstr(f.err, "cannot open"));
}

int main(void) {
    static golden_state states[GOLDEN_NOPS];
    static char names[GOLDEN_NOPS][96];
    struct CMUnitTest tests[GOLDEN_NOPS + 2] = {
        MT_TEST(test_golden_index),
        MT_TEST(test_golden_reader_errors),
    };
    for (int k = 0; k < GOLDEN_NOPS; k++) { /* one test per op file, named golden_<op> */
        states[k].op = &golden_ops[k];
        snprintf(names[k], sizeof names[k], "golden_%s", golden_ops[k].op);
        tests[k + 2] =
            (struct CMUnitTest){names[k], golden_test, golden_setup, golden_teardown, &states[k]};
        if (golden_ops[k].cpu_only && !mt_test_device_is_cpu()) { /* reported skipped */
            snprintf(names[k], sizeof names[k], "golden_%s # SKIP %s", golden_ops[k].op,
                     golden_ops[k].cpu_only);
            tests[k + 2] = (struct CMUnitTest){.name = names[k], .test_func = mt_test_not_run};
        }
    }
    return MT_RUN_TESTS(tests);
}
