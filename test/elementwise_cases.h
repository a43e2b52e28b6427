/* Shared by the elementwise test programs (test_elementwise.c: forward values, broadcasting,
   layouts and promotion; test_elementwise_grad.c: gradients and errors): deterministic inputs,
   reference formulas in double and the op case tables. */
#ifndef MT_TEST_ELEMENTWISE_CASES_H
#define MT_TEST_ELEMENTWISE_CASES_H

#include "test_util.h"

/* ---- deterministic inputs */
static uint64_t rng_state = 0x243f6a8885a308d3ULL;
static inline double urand(double lo, double hi) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * (double)(rng_state >> 11) * 0x1.0p-53;
}
/* n values in [lo, hi), kept at least 0.05 away from 0 (kinks of abs/relu/sign) */
static inline void fill(double *x, int64_t n, double lo, double hi) {
    for (int64_t i = 0; i < n; i++) {
        double v = urand(lo, hi);
        if (fabs(v) < 0.05) v = v < 0 ? v - 0.05 : v + 0.05;
        x[i] = v;
    }
}
/* a tensor of dtype dt with values from the domain */
static inline mt_tensor *make(mt_dtype dt, double lo, double hi, int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    double *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    fill(x, n, lo, hi);
    mt_tensor *t = mt_test_tensor(x, dt, ndim, shape);
    free(x);
    return t;
}

static inline bool is_low(mt_dtype dt) {
    return dt == MT_F16 || dt == MT_BF16;
}

/* ---- reference formulas in double */
static inline double r_add(double a, double b) {
    return a + b;
}
static inline double r_sub(double a, double b) {
    return a - b;
}
static inline double r_mul(double a, double b) {
    return a * b;
}
static inline double r_div(double a, double b) {
    return a / b;
}
static inline double r_pow(double a, double b) {
    return pow(a, b);
}
static inline double r_max(double a, double b) {
    return a > b ? a : b;
}
static inline double r_min(double a, double b) {
    return a < b ? a : b;
}
static inline double r_eq(double a, double b) {
    return a == b;
}
static inline double r_ne(double a, double b) {
    return a != b;
}
static inline double r_lt(double a, double b) {
    return a < b;
}
static inline double r_le(double a, double b) {
    return a <= b;
}
static inline double r_gt(double a, double b) {
    return a > b;
}
static inline double r_ge(double a, double b) {
    return a >= b;
}

static inline double r_neg(double x) {
    return -x;
}
static inline double r_sqrt(double x) {
    return sqrt(x);
}
static inline double r_rsqrt(double x) {
    return 1 / sqrt(x);
}
static inline double r_relu(double x) {
    return x > 0 ? x : 0;
}
static inline double r_gelu(double x) {
    return 0.5 * x * (1 + erf(x / sqrt(2.0)));
}
static inline double r_gelu_tanh(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
static inline double r_sigmoid(double x) {
    return 1 / (1 + exp(-x));
}

typedef mt_tensor *(*binary_fn)(mt_tensor *, mt_tensor *);
typedef mt_tensor *(*unary_fn)(mt_tensor *);
typedef mt_tensor *(*scalar_fn)(mt_tensor *, double);

typedef struct {
    const char *name;
    binary_fn fn;
    double (*ref)(double, double);
    double alo, ahi, blo, bhi;
    bool compare;
} binary_case;

static const binary_case binary_cases[] = {
    {"add", mt_add, r_add, -2, 2, -2, 2, false},
    {"sub", mt_sub, r_sub, -2, 2, -2, 2, false},
    {"mul", mt_mul, r_mul, -2, 2, -2, 2, false},
    {"div", mt_div, r_div, -2, 2, 0.5, 2, false},
    {"pow", mt_pow, r_pow, 0.5, 2, -2, 2, false},
    {"maximum", mt_maximum, r_max, -2, 2, -2, 2, false},
    {"minimum", mt_minimum, r_min, -2, 2, -2, 2, false},
    {"eq", mt_eq, r_eq, -1, 1, -1, 1, true},
    {"ne", mt_ne, r_ne, -1, 1, -1, 1, true},
    {"lt", mt_lt, r_lt, -1, 1, -1, 1, true},
    {"le", mt_le, r_le, -1, 1, -1, 1, true},
    {"gt", mt_gt, r_gt, -1, 1, -1, 1, true},
    {"ge", mt_ge, r_ge, -1, 1, -1, 1, true},
};
#define N_BINARY (int)(sizeof binary_cases / sizeof *binary_cases)

typedef struct {
    const char *name;
    unary_fn fn;
    double (*ref)(double);
    double lo, hi;
} unary_case;

static const unary_case unary_cases[] = {
    {"neg", mt_neg, r_neg, -2, 2},
    {"exp", mt_exp, exp, -3, 3},
    {"log", mt_log, log, 0.1, 4},
    {"sqrt", mt_sqrt, r_sqrt, 0.1, 4},
    {"rsqrt", mt_rsqrt, r_rsqrt, 0.1, 4},
    {"abs", mt_abs, fabs, -2, 2},
    {"relu", mt_relu, r_relu, -2, 2},
    {"gelu", mt_gelu, r_gelu, -3, 3},
    {"gelu_tanh", mt_gelu_tanh, r_gelu_tanh, -3, 3},
    {"sigmoid", mt_sigmoid, r_sigmoid, -4, 4},
    {"tanh", mt_tanh, tanh, -2, 2},
};
#define N_UNARY (int)(sizeof unary_cases / sizeof *unary_cases)

typedef struct {
    const char *name;
    scalar_fn fn;
    double s;
    double lo, hi;
} scalar_case;

static inline double scalar_ref(scalar_fn fn, double x, double s) {
    if (fn == mt_add_scalar) return x + s;
    if (fn == mt_mul_scalar) return x * s;
    if (fn == mt_pow_scalar) return pow(x, s);
    if (fn == mt_rsub_scalar) return s - x;
    return s / x; /* rdiv */
}

static const scalar_case scalar_cases[] = {
    {"add_scalar", mt_add_scalar, 1.5, -2, 2},
    {"mul_scalar", mt_mul_scalar, -2.5, -2, 2},
    {"pow_scalar 2", mt_pow_scalar, 2, -2, 2},
    {"pow_scalar 3", mt_pow_scalar, 3, -2, 2},
    {"pow_scalar 0.5", mt_pow_scalar, 0.5, 0.1, 3},
    {"pow_scalar -1.5", mt_pow_scalar, -1.5, 0.2, 3},
    {"rsub_scalar", mt_rsub_scalar, 3, -2, 2},
    {"rdiv_scalar", mt_rdiv_scalar, 2, 0.5, 2},
};
#define N_SCALAR (int)(sizeof scalar_cases / sizeof *scalar_cases)

/* Binary op inputs for comparisons come from a small set, so equality happens. */
static inline mt_tensor *make_binary_input(const binary_case *c, bool first, mt_dtype dt, int ndim,
                                           const int64_t *shape) {
    if (!c->compare)
        return first ? make(dt, c->alo, c->ahi, ndim, shape)
                     : make(dt, c->blo, c->bhi, ndim, shape);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    double *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = floor(urand(-2, 2)) * 0.5;
    mt_tensor *t = mt_test_tensor(x, dt, ndim, shape);
    free(x);
    return t;
}

/* out[i] = ref(a[ia], b[ib]) with NumPy broadcasting of the logical values */
static inline void broadcast_ref(double (*ref)(double, double), const mt_tensor *a,
                                 const double *av, const mt_tensor *b, const double *bv,
                                 const mt_tensor *out, double *expect) {
    int nd = mt_ndim(out);
    int64_t n = mt_numel(out);
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, ia = 0, ib = 0, sa = 1, sb = 1;
        for (int d = nd - 1; d >= 0; d--) {
            int64_t coord = rem % mt_dim(out, d);
            rem /= mt_dim(out, d);
            int da = d - (nd - mt_ndim(a)), db = d - (nd - mt_ndim(b));
            if (da >= 0) {
                if (mt_shape(a)[da] != 1) ia += coord * sa;
                sa *= mt_shape(a)[da];
            }
            if (db >= 0) {
                if (mt_shape(b)[db] != 1) ib += coord * sb;
                sb *= mt_shape(b)[db];
            }
        }
        expect[i] = ref(av[ia], bv[ib]);
    }
}

/* Checks y = op(a, b) against the reference for F64/F32 (tolerance) or against the F32
   result rounded to the low dtype (exact). */
static inline void check_binary_result(const binary_case *c, mt_tensor *a, mt_tensor *b,
                                       mt_tensor *y) {
    assert_no_error();
    if (!y) fail_msg("%s returned NULL", c->name);
    if (c->compare) assert_int_equal(mt_dtype_of(y), MT_BOOL);
    int64_t n = mt_numel(y);
    double *av = mt_test_values(a), *bv = mt_test_values(b);
    double *e = malloc((size_t)(n ? n : 1) * sizeof *e);
    broadcast_ref(c->ref, a, av, b, bv, y, e);
    mt_dtype odt = c->compare ? mt_dtype_of(a) : mt_dtype_of(y);
    if (c->compare) {
        assert_tensor_close(y, e, n, 0, 0);
    } else if (odt == MT_F64) {
        assert_tensor_close(y, e, n, 1e-14, 1e-13);
    } else if (odt == MT_F32) {
        assert_tensor_close(y, e, n, 1e-6, 1e-5);
    } else { /* low: same as the F32 computation rounded once */
        mt_tensor *a32 = mt_cast(a, MT_F32), *b32 = mt_cast(b, MT_F32);
        mt_tensor *y32 = c->fn(a32, b32), *yl = mt_cast(y32, odt);
        double *ev = mt_test_values(yl);
        assert_tensor_close(y, ev, n, 0, 0);
        assert_tensor_close(y, e, n, 1e-2, odt == MT_F16 ? 2e-3 : 1.6e-2);
        free(ev);
        mt_release(a32);
        mt_release(b32);
        mt_release(y32);
        mt_release(yl);
    }
    free(av);
    free(bv);
    free(e);
}

static const mt_dtype all_float[] = {MT_F64, MT_F32, MT_F16, MT_BF16};

#endif
