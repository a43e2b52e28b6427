/* Elementwise ops: every binary, scalar, unary and comparison op and where, against loops in
   this file, in F64 and F32; F16/BF16 equal the F32 result rounded to the low dtype;
   broadcasting, non-contiguous inputs, dtype promotion, FP64 gradient checks and errors. */
#include "test_util.h"

/* ---- deterministic inputs */
static uint64_t rng_state = 0x243f6a8885a308d3ULL;
static double urand(double lo, double hi) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * (double)(rng_state >> 11) * 0x1.0p-53;
}
/* n values in [lo, hi), kept at least 0.05 away from 0 (kinks of abs/relu/sign) */
static void fill(double *x, int64_t n, double lo, double hi) {
    for (int64_t i = 0; i < n; i++) {
        double v = urand(lo, hi);
        if (fabs(v) < 0.05) v = v < 0 ? v - 0.05 : v + 0.05;
        x[i] = v;
    }
}
/* a tensor of dtype dt with values from the domain */
static mt_tensor *make(mt_dtype dt, double lo, double hi, int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    double *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    fill(x, n, lo, hi);
    mt_tensor *t = mt_test_tensor(x, dt, ndim, shape);
    free(x);
    return t;
}

static bool is_low(mt_dtype dt) {
    return dt == MT_F16 || dt == MT_BF16;
}

/* ---- reference formulas in double */
static double r_add(double a, double b) {
    return a + b;
}
static double r_sub(double a, double b) {
    return a - b;
}
static double r_mul(double a, double b) {
    return a * b;
}
static double r_div(double a, double b) {
    return a / b;
}
static double r_pow(double a, double b) {
    return pow(a, b);
}
static double r_max(double a, double b) {
    return a > b ? a : b;
}
static double r_min(double a, double b) {
    return a < b ? a : b;
}
static double r_eq(double a, double b) {
    return a == b;
}
static double r_ne(double a, double b) {
    return a != b;
}
static double r_lt(double a, double b) {
    return a < b;
}
static double r_le(double a, double b) {
    return a <= b;
}
static double r_gt(double a, double b) {
    return a > b;
}
static double r_ge(double a, double b) {
    return a >= b;
}

static double r_neg(double x) {
    return -x;
}
static double r_sqrt(double x) {
    return sqrt(x);
}
static double r_rsqrt(double x) {
    return 1 / sqrt(x);
}
static double r_relu(double x) {
    return x > 0 ? x : 0;
}
static double r_gelu(double x) {
    return 0.5 * x * (1 + erf(x / sqrt(2.0)));
}
static double r_gelu_tanh(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
static double r_sigmoid(double x) {
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

static double scalar_ref(scalar_fn fn, double x, double s) {
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
static mt_tensor *make_binary_input(const binary_case *c, bool first, mt_dtype dt, int ndim,
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
static void broadcast_ref(double (*ref)(double, double), const mt_tensor *a, const double *av,
                          const mt_tensor *b, const double *bv, const mt_tensor *out,
                          double *expect) {
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
static void check_binary_result(const binary_case *c, mt_tensor *a, mt_tensor *b, mt_tensor *y) {
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

static void test_binary_same_shape(void **state) {
    (void)state;
    for (int k = 0; k < N_BINARY; k++)
        for (int d = 0; d < 4; d++) {
            const binary_case *c = &binary_cases[k];
            /* 300 elements: vector bodies, tails and more than one conversion block */
            mt_tensor *a = make_binary_input(c, true, all_float[d], MT_SHAPE(3, 100));
            mt_tensor *b = make_binary_input(c, false, all_float[d], MT_SHAPE(3, 100));
            mt_tensor *y = c->fn(a, b);
            assert_shape(y, 3, 100);
            assert_int_equal(mt_dtype_of(y), c->compare ? MT_BOOL : all_float[d]);
            check_binary_result(c, a, b, y);
            mt_release(a);
            mt_release(b);
            mt_release(y);
        }
}

static void test_binary_broadcast(void **state) {
    (void)state;
    struct {
        int na, nb;
        int64_t sa[3], sb[3];
        int nout;
        int64_t sout[3];
    } shapes[] = {
        {3, 2, {2, 3, 4}, {3, 1}, 3, {2, 3, 4}}, /* trailing dims, one broadcast */
        {1, 3, {4}, {2, 1, 4}, 3, {2, 1, 4}},    /* leading dims added */
        {0, 2, {0}, {2, 3}, 2, {2, 3}},          /* 0-d with a matrix */
        {2, 0, {2, 3}, {0}, 2, {2, 3}},          /* matrix with 0-d */
        {2, 2, {2, 1}, {1, 3}, 2, {2, 3}},       /* both broadcast */
        {0, 0, {0}, {0}, 0, {0}},                /* 0-d with 0-d */
        {3, 1, {5, 1, 70}, {70}, 3, {5, 1, 70}}, /* rows longer than a vector */
    };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int k = 0; k < N_BINARY; k++)
            for (int d = 0; d < 4; d++) {
                const binary_case *c = &binary_cases[k];
                mt_tensor *a = make_binary_input(c, true, all_float[d], shapes[s].na, shapes[s].sa);
                mt_tensor *b =
                    make_binary_input(c, false, all_float[d], shapes[s].nb, shapes[s].sb);
                mt_tensor *y = c->fn(a, b);
                assert_no_error();
                mt_test_assert_shape(y, shapes[s].nout, shapes[s].sout, __FILE__, __LINE__);
                check_binary_result(c, a, b, y);
                mt_release(a);
                mt_release(b);
                mt_release(y);
            }
}

static void test_binary_noncontiguous(void **state) {
    (void)state;
    for (int k = 0; k < N_BINARY; k++)
        for (int d = 0; d < 4; d++) {
            const binary_case *c = &binary_cases[k];
            mt_dtype dt = all_float[d];
            mt_tensor *x = make_binary_input(c, true, dt, MT_SHAPE(5, 3));
            mt_tensor *xt = mt_transpose(x, 0, 1); /* [3, 5], strides (1, 3) */
            mt_tensor *b = make_binary_input(c, false, dt, MT_SHAPE(3, 5));
            mt_tensor *bbase = make_binary_input(c, false, dt, MT_SHAPE(5, 3));
            mt_tensor *bt = mt_transpose(bbase, 0, 1);
            mt_tensor *col = make_binary_input(c, false, dt, MT_SHAPE(3, 1));
            mt_tensor *ex = mt_expand(col, MT_SHAPE(3, 5)); /* stride 0 along dim 1 */
            mt_tensor *wide = make_binary_input(c, true, dt, MT_SHAPE(3, 10));
            mt_tensor *stepped = mt_slice(wide, 1, 0, 10, 2); /* inner stride 2 */
            assert_no_error();
            assert_false(mt_is_contiguous(xt));
            mt_tensor *y1 = c->fn(xt, b), *y2 = c->fn(b, xt), *y3 = c->fn(xt, bt);
            mt_tensor *y4 = c->fn(ex, xt), *y5 = c->fn(stepped, bt);
            check_binary_result(c, xt, b, y1);
            check_binary_result(c, b, xt, y2);
            check_binary_result(c, xt, bt, y3);
            check_binary_result(c, ex, xt, y4);
            check_binary_result(c, stepped, bt, y5);
            mt_release(bbase);
            mt_release(x);
            mt_release(xt);
            mt_release(b);
            mt_release(bt);
            mt_release(col);
            mt_release(ex);
            mt_release(wide);
            mt_release(stepped);
            mt_release(y1);
            mt_release(y2);
            mt_release(y3);
            mt_release(y4);
            mt_release(y5);
        }
}

/* ---- unary and scalar */
static void check_unary_values(const char *name, mt_tensor *x, mt_tensor *y, double (*ref)(double),
                               scalar_fn sfn, double s) {
    assert_no_error();
    if (!y) fail_msg("%s returned NULL", name);
    int64_t n = mt_numel(x);
    double *xv = mt_test_values(x);
    double *e = malloc((size_t)n * sizeof *e);
    for (int64_t i = 0; i < n; i++) e[i] = ref ? ref(xv[i]) : scalar_ref(sfn, xv[i], s);
    mt_dtype dt = mt_dtype_of(y);
    if (dt == MT_F64) {
        assert_tensor_close(y, e, n, 1e-14, 1e-13);
    } else if (dt == MT_F32) {
        assert_tensor_close(y, e, n, 1e-6, 1e-5);
    } else {
        assert_tensor_close(y, e, n, 1e-2, dt == MT_F16 ? 2e-3 : 1.6e-2);
    }
    free(xv);
    free(e);
}

/* low dtype: exactly the F32 op rounded to the low dtype */
static void check_low_equals_f32(mt_tensor *x, mt_tensor *y, unary_fn ufn, scalar_fn sfn,
                                 double s) {
    mt_tensor *x32 = mt_cast(x, MT_F32);
    mt_tensor *y32 = ufn ? ufn(x32) : sfn(x32, s);
    mt_tensor *yl = mt_cast(y32, mt_dtype_of(y));
    double *ev = mt_test_values(yl);
    assert_tensor_close(y, ev, mt_numel(y), 0, 0);
    free(ev);
    mt_release(x32);
    mt_release(y32);
    mt_release(yl);
}

static void test_unary(void **state) {
    (void)state;
    for (int k = 0; k < N_UNARY; k++)
        for (int d = 0; d < 4; d++) {
            const unary_case *c = &unary_cases[k];
            mt_tensor *x = make(all_float[d], c->lo, c->hi, MT_SHAPE(300));
            mt_tensor *y = c->fn(x);
            assert_shape(y, 300);
            assert_int_equal(mt_dtype_of(y), all_float[d]);
            check_unary_values(c->name, x, y, c->ref, NULL, 0);
            if (is_low(all_float[d])) check_low_equals_f32(x, y, c->fn, NULL, 0);
            /* non-contiguous input: a transposed view and a stepped slice */
            mt_tensor *m = make(all_float[d], c->lo, c->hi, MT_SHAPE(7, 6));
            mt_tensor *mt = mt_transpose(m, 0, 1), *sl = mt_slice(m, 1, 1, 6, 2);
            mt_tensor *y1 = c->fn(mt), *y2 = c->fn(sl);
            assert_shape(y1, 6, 7);
            assert_shape(y2, 7, 3);
            check_unary_values(c->name, mt, y1, c->ref, NULL, 0);
            check_unary_values(c->name, sl, y2, c->ref, NULL, 0);
            if (is_low(all_float[d])) check_low_equals_f32(mt, y1, c->fn, NULL, 0);
            /* 0-d */
            mt_tensor *z = make(all_float[d], c->lo, c->hi, 0, NULL), *yz = c->fn(z);
            assert_int_equal(mt_ndim(yz), 0);
            check_unary_values(c->name, z, yz, c->ref, NULL, 0);
            mt_release(x);
            mt_release(y);
            mt_release(m);
            mt_release(mt);
            mt_release(sl);
            mt_release(y1);
            mt_release(y2);
            mt_release(z);
            mt_release(yz);
        }
}

static void test_unary_special_values(void **state) {
    (void)state;
    double x[6] = {0.0, -0.0, INFINITY, -INFINITY, NAN, -1.0};
    mt_tensor *t = mt_from_data(x, MT_F64, MT_SHAPE(6), mt_test_device());
    mt_tensor *r = mt_relu(t), *s = mt_sigmoid(t), *l = mt_log(t), *q = mt_sqrt(t);
    double er[6] = {0, 0, INFINITY, 0, NAN, 0};
    double es[6] = {0.5, 0.5, 1, 0, NAN, 1 / (1 + exp(1.0))};
    double el[6] = {-INFINITY, -INFINITY, INFINITY, NAN, NAN, NAN};
    double eq[6] = {0, -0.0, INFINITY, NAN, NAN, NAN};
    assert_tensor_close(r, er, 6, 0, 0);
    assert_tensor_close(s, es, 6, 1e-15, 1e-15);
    assert_tensor_close(l, el, 6, 0, 0);
    assert_tensor_close(q, eq, 6, 0, 0);
    /* maximum and minimum propagate NaN from either side */
    double y[6] = {1, NAN, 1, 1, 1, 1};
    mt_tensor *u = mt_from_data(y, MT_F64, MT_SHAPE(6), mt_test_device());
    mt_tensor *mx = mt_maximum(t, u), *mn = mt_minimum(u, t);
    double emx[6] = {1, NAN, INFINITY, 1, NAN, 1}, emn[6] = {0, NAN, 1, -INFINITY, NAN, -1};
    assert_tensor_close(mx, emx, 6, 0, 0);
    assert_tensor_close(mn, emn, 6, 0, 0);
    mt_release(t);
    mt_release(r);
    mt_release(s);
    mt_release(l);
    mt_release(q);
    mt_release(u);
    mt_release(mx);
    mt_release(mn);
}

static void test_scalar_ops(void **state) {
    (void)state;
    for (int k = 0; k < N_SCALAR; k++)
        for (int d = 0; d < 4; d++) {
            const scalar_case *c = &scalar_cases[k];
            mt_tensor *x = make(all_float[d], c->lo, c->hi, MT_SHAPE(2, 150));
            mt_tensor *y = c->fn(x, c->s);
            assert_shape(y, 2, 150);
            assert_int_equal(mt_dtype_of(y), all_float[d]);
            check_unary_values(c->name, x, y, NULL, c->fn, c->s);
            if (is_low(all_float[d])) check_low_equals_f32(x, y, NULL, c->fn, c->s);
            mt_tensor *xt = mt_transpose(x, 0, 1), *yt = c->fn(xt, c->s);
            check_unary_values(c->name, xt, yt, NULL, c->fn, c->s);
            mt_release(x);
            mt_release(y);
            mt_release(xt);
            mt_release(yt);
        }
}

/* Large enough for the parallel path; checks the chunk boundaries. */
static void test_large_parallel(void **state) {
    (void)state;
    const int64_t n = 100003;
    for (int d = 0; d < 4; d++) {
        mt_tensor *a = make(all_float[d], -2, 2, MT_SHAPE(n)),
                  *b = make(all_float[d], -2, 2, MT_SHAPE(n));
        mt_tensor *y = mt_add(a, b), *e = mt_exp(a);
        check_binary_result(&binary_cases[0], a, b, y);
        check_unary_values("exp", a, e, exp, NULL, 0);
        if (is_low(all_float[d])) check_low_equals_f32(a, e, mt_exp, NULL, 0);
        /* broadcast over a large output: a row added to every row */
        mt_tensor *m = make(all_float[d], -2, 2, MT_SHAPE(400, 300)),
                  *r = make(all_float[d], -2, 2, MT_SHAPE(300));
        mt_tensor *mr = mt_mul(m, r);
        check_binary_result(&binary_cases[2], m, r, mr);
        mt_release(a);
        mt_release(b);
        mt_release(y);
        mt_release(e);
        mt_release(m);
        mt_release(r);
        mt_release(mr);
    }
}

/* exp, log, tanh, erf (in gelu) in F32 run vectorisable polynomials (src/math): check them
   against the double formulas over a sweep of the float range and special values, in units
   in the last place of the F32 result. */
static double r_gelu_erfc(double x) {
    return 0.5 * x * erfc(-x / sqrt(2.0));
}

typedef struct {
    const char *name;
    unary_fn fn;
    double (*ref)(double);
    double lo, hi; /* swept domain */
    double max_ulp;
} accuracy_case;

static void test_f32_accuracy(void **state) {
    (void)state;
    const accuracy_case cases[] = {
        {"exp", mt_exp, exp, -110, 90, 1.5},
        {"log", mt_log, log, 0, INFINITY, 1.0},
        {"tanh", mt_tanh, tanh, -INFINITY, INFINITY, 1.5},
        {"sigmoid", mt_sigmoid, r_sigmoid, -88, 90, 2.5}, /* exp(-x) overflows below */
        {"gelu", mt_gelu, r_gelu_erfc, -5, 1e30, 32},
        {"gelu_tanh", mt_gelu_tanh, r_gelu_tanh, -2, 1e30, 32}, /* 1 + tanh cancels below */
    };
    const float special[] = {0.0f,   -0.0f,  INFINITY, -INFINITY, NAN,     88.72f,  88.7229f,
                             88.73f, 89.5f,  -87.0f,   -100.0f,   -103.9f, -104.5f, 1e-8f,
                             -1e-8f, 1e-40f, -1e-40f,  0.625f,    -0.625f, 0.5f,    -0.5f};
    const int64_t n = 1 << 19;
    float *x = malloc((size_t)n * sizeof *x);
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const accuracy_case *c = &cases[k];
        int64_t m = 0;
        for (uint64_t b = k; b <= 0xffffffffu && m < n - 32; b += 8191) {
            uint32_t u = (uint32_t)b;
            float f;
            memcpy(&f, &u, 4);
            if (f >= c->lo && f <= c->hi) x[m++] = f;
        }
        for (size_t i = 0; i < sizeof special / sizeof *special; i++)
            if (isnan(special[i]) || (special[i] >= c->lo && special[i] <= c->hi))
                x[m++] = special[i];
        mt_tensor *t = mt_from_data(x, MT_F32, MT_SHAPE(m), mt_test_device()), *y = c->fn(t);
        assert_no_error();
        float *yv = malloc((size_t)m * sizeof *yv);
        assert_int_equal(mt_copy_to_host(y, yv, (size_t)m * sizeof *yv), 0);
        double worst = 0;
        for (int64_t i = 0; i < m; i++) {
            double e = c->ref((double)x[i]);
            float got = yv[i];
            if (isnan(e)) {
                if (!isnan(got))
                    fail_msg("%s(%a) = %a, expected NaN", c->name, (double)x[i], (double)got);
                continue;
            }
            if (fabs(e) > 3.4028235677973366e38) { /* rounds to inf */
                if (!(isinf(got) && (got > 0) == (e > 0)))
                    fail_msg("%s(%a) = %a, expected %g", c->name, (double)x[i], (double)got, e);
                continue;
            }
            int ex;
            frexp(e, &ex);
            double err = fabs(got - e) / ldexp(1, (ex < -125 ? -125 : ex) - 24);
            if (err > worst) worst = err;
            if (err > c->max_ulp)
                fail_msg("%s(%a) = %a, expected %a (%.2f ulp)", c->name, (double)x[i], (double)got,
                         e, err);
        }
        assert_true(worst > 0); /* the sweep did compare something */
        free(yv);
        mt_release(t);
        mt_release(y);
    }
    free(x);
}

/* ---- copies between layouts and dtypes (the copy kernel behind contiguous, clone, cast) */
static void test_copy_layouts(void **state) {
    (void)state;
    const mt_dtype dts[] = {MT_F64, MT_F32, MT_F16, MT_BF16, MT_I64, MT_I32, MT_BOOL};
    const int64_t sizes[][2] = {{37, 70}, {64, 32}, {5, 300}, {1000, 3}};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
        for (size_t d = 0; d < sizeof dts / sizeof *dts; d++) {
            int64_t r = sizes[si][0], c = sizes[si][1];
            double *v = malloc((size_t)(r * c) * sizeof *v);
            for (int64_t i = 0; i < r * c; i++) v[i] = (double)((i * 7919) % 61) - 30;
            if (dts[d] == MT_BOOL)
                for (int64_t i = 0; i < r * c; i++) v[i] = v[i] > 0;
            mt_tensor *m = mt_test_tensor(v, dts[d], MT_SHAPE(r, c));
            mt_tensor *t = mt_transpose(m, 0, 1), *tc = mt_contiguous(t), *tl = mt_clone(t);
            assert_no_error();
            assert_true(mt_is_contiguous(tc));
            double *e = malloc((size_t)(r * c) * sizeof *e);
            for (int64_t i = 0; i < c; i++)
                for (int64_t j = 0; j < r; j++) e[i * r + j] = v[j * c + i];
            assert_tensor_close(tc, e, r * c, 0, 0);
            assert_tensor_close(tl, e, r * c, 0, 0);
            /* transposed and converted at once, to every floating dtype */
            for (int k = 0; k < 4; k++) {
                mt_tensor *x = mt_cast(t, all_float[k]);
                assert_int_equal(mt_dtype_of(x), all_float[k]);
                assert_tensor_close(x, e, r * c, 0, 0); /* small integers: exact everywhere */
                mt_release(x);
            }
            /* a 3-d permutation and a stepped slice */
            if (c % 2 == 0) {
                mt_tensor *m3 = mt_reshape(m, MT_SHAPE(r, c / 2, 2));
                mt_tensor *p = mt_permute(m3, MT_DIMS(2, 0, 1)), *pc = mt_contiguous(p);
                for (int64_t a = 0; a < 2; a++)
                    for (int64_t i = 0; i < r; i++)
                        for (int64_t j = 0; j < c / 2; j++)
                            e[(a * r + i) * (c / 2) + j] = v[i * c + j * 2 + a];
                assert_tensor_close(pc, e, r * c, 0, 0);
                mt_release(m3);
                mt_release(p);
                mt_release(pc);
            }
            free(v);
            free(e);
            mt_release(m);
            mt_release(t);
            mt_release(tc);
            mt_release(tl);
        }
}

/* ---- dtype promotion */
static void test_promotion(void **state) {
    (void)state;
    struct {
        mt_dtype a, b, out;
    } cases[] = {
        {MT_F16, MT_F32, MT_F32},  {MT_F32, MT_F16, MT_F32},  {MT_F16, MT_BF16, MT_F32},
        {MT_BF16, MT_F16, MT_F32}, {MT_BF16, MT_F32, MT_F32}, {MT_F16, MT_F64, MT_F64},
        {MT_F32, MT_F64, MT_F64},  {MT_BF16, MT_F64, MT_F64},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        mt_tensor *a = make(cases[i].a, -2, 2, MT_SHAPE(4, 9)),
                  *b = make(cases[i].b, -2, 2, MT_SHAPE(9));
        for (int k = 0; k < 7; k++) { /* arithmetic ops */
            mt_tensor *y = binary_cases[k].fn(a, b);
            assert_no_error();
            assert_int_equal(mt_dtype_of(y), cases[i].out);
            /* the reference: both inputs converted exactly to the wide dtype first */
            mt_tensor *aw = mt_cast(a, cases[i].out), *bw = mt_cast(b, cases[i].out);
            mt_tensor *yw = binary_cases[k].fn(aw, bw);
            double *ev = mt_test_values(yw);
            assert_tensor_close(y, ev, 36, 0, 0);
            free(ev);
            mt_release(aw);
            mt_release(bw);
            mt_release(yw);
            mt_release(y);
        }
        /* comparisons promote too: 0.1 as f16 is not 0.1 as f32 */
        mt_tensor *c = mt_eq(a, a);
        bool all[36];
        mt_copy_to_host(c, all, sizeof all);
        for (int j = 0; j < 36; j++) assert_true(all[j]);
        mt_release(c);
        mt_release(a);
        mt_release(b);
    }
    mt_tensor *h = mt_full(MT_SHAPE(1), MT_F16, mt_test_device(), 0.1),
              *f = mt_full(MT_SHAPE(1), MT_F32, mt_test_device(), 0.1);
    mt_tensor *eq = mt_eq(h, f);
    assert_no_error();
    assert_int_equal(mt_dtype_of(eq), MT_BOOL);
    assert_true(mt_item(eq) == 0.0);
    /* F16 + BF16 computes in F32: 1 + 2^-9 survives although neither low dtype could hold it
       after rounding the sum to bf16 */
    mt_tensor *one = mt_ones(MT_SHAPE(1), MT_BF16, mt_test_device()),
              *small = mt_full(MT_SHAPE(1), MT_F16, mt_test_device(), ldexp(1, -9));
    mt_tensor *sum = mt_add(one, small);
    assert_int_equal(mt_dtype_of(sum), MT_F32);
    assert_true(mt_item(sum) == 1 + ldexp(1, -9));
    mt_release(h);
    mt_release(f);
    mt_release(eq);
    mt_release(one);
    mt_release(small);
    mt_release(sum);
}

/* ---- where */
static void test_where(void **state) {
    (void)state;
    for (int d = 0; d < 4; d++) {
        mt_dtype dt = all_float[d];
        mt_tensor *p = make(MT_F64, -1, 1, MT_SHAPE(3, 1)),
                  *zero = mt_scalar(0, MT_F64, mt_test_device());
        mt_tensor *cond = mt_gt(p, zero); /* [3, 1] */
        mt_tensor *a = make(dt, -2, 2, MT_SHAPE(1, 4)), *b = make(dt, -2, 2, 0, NULL);
        mt_tensor *y = mt_where(cond, a, b);
        assert_no_error();
        assert_shape(y, 3, 4);
        assert_int_equal(mt_dtype_of(y), dt);
        double *cv = mt_test_values(cond), *av = mt_test_values(a), *bv = mt_test_values(b);
        double e[12];
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 4; j++) e[i * 4 + j] = cv[i] != 0 ? av[j] : bv[0];
        assert_tensor_close(y, e, 12, 0, 0);
        /* non-contiguous operands */
        mt_tensor *m = make(dt, -2, 2, MT_SHAPE(4, 3)), *mt = mt_transpose(m, 0, 1);
        mt_tensor *y2 = mt_where(cond, mt, a);
        double *mv = mt_test_values(mt);
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 4; j++) e[i * 4 + j] = cv[i] != 0 ? mv[i * 4 + j] : av[j];
        assert_tensor_close(y2, e, 12, 0, 0);
        free(cv);
        free(av);
        free(bv);
        free(mv);
        mt_release(p);
        mt_release(zero);
        mt_release(cond);
        mt_release(a);
        mt_release(b);
        mt_release(y);
        mt_release(m);
        mt_release(mt);
        mt_release(y2);
    }
    /* mixed dtypes promote */
    mt_tensor *c = mt_full(MT_SHAPE(2), MT_BOOL, mt_test_device(), 1);
    mt_tensor *a = mt_full(MT_SHAPE(2), MT_F16, mt_test_device(), 1.5),
              *b = mt_full(MT_SHAPE(2), MT_F32, mt_test_device(), 2);
    mt_tensor *y = mt_where(c, a, b);
    assert_int_equal(mt_dtype_of(y), MT_F32);
    double e[2] = {1.5, 1.5};
    assert_tensor_close(y, e, 2, 0, 0);
    mt_release(c);
    mt_release(a);
    mt_release(b);
    mt_release(y);
}

static void test_compare_integers(void **state) {
    (void)state;
    /* the last two differ by 1 past 2^53, where doubles could not tell them apart */
    int64_t big = (int64_t)1 << 60;
    int64_t a[5] = {1, 2, 3, big, big + 1}, b[5] = {5, 2, 1, big + 1, big + 1};
    mt_tensor *ta = mt_from_data(a, MT_I64, MT_SHAPE(5), mt_test_device()),
              *tb = mt_from_data(b, MT_I64, MT_SHAPE(5), mt_test_device());
    mt_tensor *eq = mt_eq(ta, tb), *lt = mt_lt(ta, tb);
    double eeq[5] = {0, 1, 0, 0, 1}, elt[5] = {1, 0, 0, 1, 0};
    assert_tensor_close(eq, eeq, 5, 0, 0);
    assert_tensor_close(lt, elt, 5, 0, 0);
    /* every comparison, I32 and bool too, strided */
    int32_t ia[4] = {-3, 7, 7, 0}, ib[4] = {7, 7, -3, 0};
    mt_tensor *ta32 = mt_from_data(ia, MT_I32, MT_SHAPE(4), mt_test_device());
    mt_tensor *tb32 = mt_from_data(ib, MT_I32, MT_SHAPE(4), mt_test_device());
    mt_tensor *(*fns[6])(mt_tensor *, mt_tensor *) = {mt_eq, mt_ne, mt_lt, mt_le, mt_gt, mt_ge};
    double (*refs[6])(double, double) = {r_eq, r_ne, r_lt, r_le, r_gt, r_ge};
    for (int k = 0; k < 6; k++) {
        mt_tensor *r = fns[k](ta32, tb32), *rs = fns[k](ta, ta);
        double e[4], es[5];
        for (int i = 0; i < 4; i++) e[i] = refs[k](ia[i], ib[i]);
        for (int i = 0; i < 5; i++) es[i] = refs[k](0, 0);
        assert_int_equal(mt_dtype_of(r), MT_BOOL);
        assert_tensor_close(r, e, 4, 0, 0);
        assert_tensor_close(rs, es, 5, 0, 0);
        mt_release(r);
        mt_release(rs);
    }
    mt_tensor *ba = mt_gt(ta32, tb32), *bb = mt_lt(ta32, tb32), *bx = mt_expand(ba, MT_SHAPE(4));
    mt_tensor *beq = mt_eq(ba, bb), *bge = mt_ge(bx, bb);
    double ebeq[4] = {0, 1, 0, 1}, ebge[4] = {0, 1, 1, 1};
    assert_tensor_close(beq, ebeq, 4, 0, 0);
    assert_tensor_close(bge, ebge, 4, 0, 0);
    mt_release(ba);
    mt_release(bb);
    mt_release(bx);
    mt_release(beq);
    mt_release(bge);
    mt_release(ta32);
    mt_release(tb32);
    mt_release(ta);
    mt_release(tb);
    mt_release(eq);
    mt_release(lt);
}

/* ---- gradient checks in F64 */
typedef struct {
    binary_fn bfn;
    unary_fn ufn;
    scalar_fn sfn;
    double s;
    bool transpose0; /* apply the op to input 0 transposed */
    mt_tensor *cond;
} gc_ctx;

static mt_tensor *gc_binary(mt_tensor *const *in, void *vctx) {
    gc_ctx *c = vctx;
    mt_tensor *a = c->transpose0 ? mt_transpose(in[0], 0, 1) : in[0];
    return c->bfn(a, in[1]);
}
static mt_tensor *gc_unary(mt_tensor *const *in, void *vctx) {
    gc_ctx *c = vctx;
    mt_tensor *a = c->transpose0 ? mt_transpose(in[0], 0, 1) : in[0];
    return c->ufn ? c->ufn(a) : c->sfn(a, c->s);
}
static mt_tensor *gc_where(mt_tensor *const *in, void *vctx) {
    gc_ctx *c = vctx;
    return mt_where(c->cond, in[0], in[1]);
}

static mt_tensor *leaf(double lo, double hi, int ndim, const int64_t *shape) {
    mt_tensor *t = make(MT_F64, lo, hi, ndim, shape);
    mt_set_requires_grad(t, true);
    return t;
}

static void run_gradcheck(mt_gradcheck_fn fn, mt_tensor *const *in, int n, gc_ctx *ctx,
                          const char *what) {
    int rc = mt_gradcheck(fn, in, n, ctx, NULL);
    if (rc != 0) fail_msg("gradcheck %s: %s", what, mt_last_error());
    assert_no_error();
}

static void test_gradcheck_binary(void **state) {
    (void)state;
    for (int k = 0; k < 7; k++) {
        const binary_case *c = &binary_cases[k];
        gc_ctx ctx = {.bfn = c->fn};
        struct {
            int na, nb;
            int64_t sa[3], sb[3];
            bool t0;
        } shapes[] = {
            {2, 2, {2, 3}, {2, 3}, false}, /* same shape */
            {3, 1, {2, 2, 3}, {3}, false}, /* b broadcast over leading dims */
            {2, 2, {2, 1}, {1, 3}, false}, /* both broadcast */
            {2, 0, {2, 3}, {0}, false},    /* 0-d */
            {2, 2, {3, 2}, {2, 3}, true},  /* a transposed (non-contiguous) */
            {2, 2, {3, 2}, {2, 1}, true},  /* transposed and broadcast */
        };
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            ctx.transpose0 = shapes[s].t0;
            mt_tensor *in[2] = {leaf(c->alo, c->ahi, shapes[s].na, shapes[s].sa),
                                leaf(c->blo, c->bhi, shapes[s].nb, shapes[s].sb)};
            char what[64];
            snprintf(what, sizeof what, "%s (shape case %zu)", c->name, s);
            run_gradcheck(gc_binary, in, 2, &ctx, what);
            /* one input without grad: only the other is checked and gets a gradient */
            mt_set_requires_grad(in[1], false);
            run_gradcheck(gc_binary, in, 2, &ctx, what);
            mt_release(in[0]);
            mt_release(in[1]);
        }
    }
}

static void test_gradcheck_unary(void **state) {
    (void)state;
    for (int k = 0; k < N_UNARY; k++) {
        const unary_case *c = &unary_cases[k];
        for (int t = 0; t < 2; t++) {
            gc_ctx ctx = {.ufn = c->fn, .transpose0 = t};
            mt_tensor *in[1] = {leaf(c->lo, c->hi, MT_SHAPE(3, 4))};
            run_gradcheck(gc_unary, in, 1, &ctx, c->name);
            mt_release(in[0]);
        }
    }
    for (int k = 0; k < N_SCALAR; k++) {
        const scalar_case *c = &scalar_cases[k];
        for (int t = 0; t < 2; t++) {
            gc_ctx ctx = {.sfn = c->fn, .s = c->s, .transpose0 = t};
            mt_tensor *in[1] = {leaf(c->lo, c->hi, MT_SHAPE(3, 4))};
            run_gradcheck(gc_unary, in, 1, &ctx, c->name);
            mt_release(in[0]);
        }
    }
}

static void test_gradcheck_where(void **state) {
    (void)state;
    double cv[6] = {1, 0, 0, 1, 1, 0};
    mt_tensor *c64 = mt_from_data(cv, MT_F64, MT_SHAPE(2, 3), mt_test_device());
    gc_ctx ctx = {.cond = mt_cast(c64, MT_BOOL)};
    mt_tensor *in[2] = {leaf(-2, 2, MT_SHAPE(2, 3)), leaf(-2, 2, MT_SHAPE(3))};
    run_gradcheck(gc_where, in, 2, &ctx, "where");
    mt_release(in[0]);
    mt_release(in[1]);
    mt_release(c64);
    mt_release(ctx.cond);
}

/* Gradients of ops on F16/BF16 inputs come back in the inputs' dtypes; values are close to
   the F64 gradients. */
static void test_low_precision_backward(void **state) {
    (void)state;
    for (int d = 2; d < 4; d++) {
        mt_dtype dt = all_float[d];
        mt_tensor *a = make(dt, 0.5, 2, MT_SHAPE(2, 5)), *b = make(MT_F32, 0.5, 2, MT_SHAPE(5));
        mt_set_requires_grad(a, true);
        mt_set_requires_grad(b, true);
        mt_tensor *ea_ = mt_exp(a), *y = mt_mul(ea_, b); /* f32 [2, 5] */
        assert_int_equal(mt_dtype_of(y), MT_F32);
        mt_tensor *seed = mt_ones(MT_SHAPE(2, 5), MT_F32, mt_test_device());
        assert_int_equal(mt_backward(y, seed), 0);
        assert_no_error();
        mt_tensor *ga = mt_grad(a), *gb = mt_grad(b);
        assert_int_equal(mt_dtype_of(ga), dt);
        assert_int_equal(mt_dtype_of(gb), MT_F32);
        assert_shape(gb, 5);
        double *av = mt_test_values(a), *bv = mt_test_values(b), ea[10], eb[5] = {0};
        for (int i = 0; i < 10; i++) {
            double ex = exp(av[i]);
            ea[i] = ex * bv[i % 5];
            eb[i % 5] += ex;
        }
        /* exp(a) is rounded to the low dtype before the multiply */
        assert_tensor_close(ga, ea, 10, 1e-2, 2e-2);
        assert_tensor_close(gb, eb, 5, 1e-2, 1e-2);
        free(av);
        free(bv);
        mt_release(ga);
        mt_release(gb);
        mt_release(seed);
        mt_release(ea_);
        mt_release(y);
        mt_release(a);
        mt_release(b);
    }
}

/* cast (through F32 and BF16 and back), clone and contiguous are differentiable copies: the
   gradient comes back in the input's dtype and equals the cotangent. FD steps are large enough
   that the low-precision rounding of x + eps stays small next to eps. */
typedef struct {
    int which;
} copy_case;

static mt_tensor *gc_copy(mt_tensor *const *in, void *vctx) {
    const copy_case *c = vctx;
    mt_tensor *x = in[0];
    mt_tensor *xt = mt_transpose(x, 0, 1); /* non-contiguous */
    switch (c->which) {
    case 0:
        return mt_mul(mt_cast(mt_cast(xt, MT_F32), MT_F64), xt);
    case 1:
        return mt_cast(mt_mul(mt_cast(x, MT_BF16), mt_cast(x, MT_BF16)), MT_F64);
    case 2:
        return mt_mul(mt_clone(xt), xt);
    case 3:
        return mt_mul(mt_contiguous(xt), mt_exp(xt));
    case 4:
        return mt_mul(mt_contiguous(x), x); /* already contiguous: x itself */
    case 5:
        return mt_mul(mt_cast(x, MT_F64), x); /* same dtype: x itself */
    case 6:
        return mt_mul(mt_to(x, mt_test_device()), x); /* same device: x itself */
    default:
        return NULL;
    }
}

static void test_gradcheck_copies(void **state) {
    (void)state;
    const mt_gradcheck_opts f32_opts = {.eps = 1e-3, .atol = 1e-3, .rtol = 1e-3};
    const mt_gradcheck_opts bf16_opts = {.eps = 0.25, .atol = 0.1, .rtol = 0.05};
    for (int w = 0; w <= 6; w++) {
        copy_case c = {w};
        mt_tensor *x = leaf(-2, 2, MT_SHAPE(3, 3));
        const mt_gradcheck_opts *o = w == 0 ? &f32_opts : w == 1 ? &bf16_opts : NULL;
        int rc = mt_gradcheck(gc_copy, &x, 1, &c, o);
        if (rc != 0) fail_msg("copy case %d: %s", w, mt_last_error());
        assert_no_error();
        mt_release(x);
    }
    /* the gradient of a cast comes back in the input's dtype */
    for (int d = 0; d < 4; d++) {
        mt_dtype dt = all_float[d];
        mt_tensor *x = make(dt, -1, 1, MT_SHAPE(2, 3));
        mt_set_requires_grad(x, true);
        mt_tensor *y = mt_cast(x, MT_F64), *z = mt_clone(y), *s = mt_sum_all(z);
        assert_int_equal(mt_backward(s, NULL), 0);
        mt_tensor *g = mt_grad(x);
        assert_non_null(g);
        assert_int_equal(mt_dtype_of(g), dt);
        double one[6] = {1, 1, 1, 1, 1, 1};
        assert_tensor_close(g, one, 6, 0, 0);
        mt_release(g);
        mt_release(s);
        mt_release(z);
        mt_release(y);
        mt_release(x);
    }
}

/* Every elementwise op names itself, the argument and the shapes or dtype in its errors. */
static void test_errors_every_op(void **state) {
    (void)state;
    mt_tensor *a = mt_zeros(MT_SHAPE(2, 3), MT_F32, mt_test_device()),
              *b = mt_zeros(MT_SHAPE(4, 3), MT_F32, mt_test_device()),
              *i = mt_zeros(MT_SHAPE(2, 3), MT_I64, mt_test_device());
    char want[96];
    for (int k = 0; k < N_BINARY; k++) {
        const binary_case *c = &binary_cases[k];
        assert_null(c->fn(a, b));
        snprintf(want, sizeof want, "mt_%s: shapes [2, 3] and [4, 3]", c->name);
        assert_error(MT_ERR_SHAPE, want);
        assert_null(c->fn(b, a));
        assert_error(MT_ERR_SHAPE, "[4, 3] and [2, 3]");
        if (c->compare) continue; /* comparisons accept integers */
        assert_null(c->fn(i, a));
        snprintf(want, sizeof want, "mt_%s: arg 1: dtype i64", c->name);
        assert_error(MT_ERR_DTYPE, want);
        assert_null(c->fn(a, i));
        snprintf(want, sizeof want, "mt_%s: arg 2: dtype i64", c->name);
        assert_error(MT_ERR_DTYPE, want);
    }
    for (int k = 0; k < N_UNARY; k++) {
        const unary_case *c = &unary_cases[k];
        assert_null(c->fn(i));
        snprintf(want, sizeof want, "mt_%s: arg 1: dtype i64", c->name);
        assert_error(MT_ERR_DTYPE, want);
    }
    const struct {
        const char *name;
        scalar_fn fn;
    } scalars[] = {{"add_scalar", mt_add_scalar},
                   {"mul_scalar", mt_mul_scalar},
                   {"pow_scalar", mt_pow_scalar},
                   {"rsub_scalar", mt_rsub_scalar},
                   {"rdiv_scalar", mt_rdiv_scalar}};
    for (size_t k = 0; k < sizeof scalars / sizeof *scalars; k++) {
        assert_null(scalars[k].fn(i, 2.0));
        snprintf(want, sizeof want, "mt_%s: arg 1: dtype i64", scalars[k].name);
        assert_error(MT_ERR_DTYPE, want);
    }
    /* where: every pair of mismatched arguments */
    mt_tensor *cond = mt_zeros(MT_SHAPE(2, 3), MT_BOOL, mt_test_device());
    mt_tensor *c4 = mt_zeros(MT_SHAPE(4, 3), MT_BOOL, mt_test_device());
    assert_null(mt_where(c4, a, a));
    assert_error(MT_ERR_SHAPE, "mt_where");
    assert_null(mt_where(cond, a, b));
    assert_error(MT_ERR_SHAPE, "mt_where");
    assert_null(mt_where(cond, i, a));
    assert_error(MT_ERR_DTYPE, "mt_where: arg 2");
    mt_release(cond);
    mt_release(c4);
    mt_release(a);
    mt_release(b);
    mt_release(i);
}

/* ---- errors */
static void test_errors(void **state) {
    (void)state;
    mt_tensor *a = mt_zeros(MT_SHAPE(2, 3), MT_F32, mt_test_device()),
              *b = mt_zeros(MT_SHAPE(4, 3), MT_F32, mt_test_device());
    assert_null(mt_add(a, b));
    assert_error(MT_ERR_SHAPE, "mt_add");
    assert_null(mt_mul(a, b));
    const char *msg = mt_last_error();
    assert_non_null(strstr(msg, "[2, 3]"));
    assert_non_null(strstr(msg, "[4, 3]"));
    assert_non_null(strstr(msg, "mt_mul"));
    mt_clear_error();
    assert_null(mt_lt(b, a));
    assert_error(MT_ERR_SHAPE, "[4, 3] and [2, 3]");
    mt_tensor *c = mt_gt(a, a);
    assert_null(mt_where(c, a, b));
    assert_error(MT_ERR_SHAPE, "mt_where");
    mt_release(c);

    /* non-floating dtypes */
    mt_tensor *i = mt_zeros(MT_SHAPE(2, 3), MT_I64, mt_test_device()),
              *bo = mt_zeros(MT_SHAPE(2, 3), MT_BOOL, mt_test_device());
    assert_null(mt_add(i, a));
    assert_error(MT_ERR_DTYPE, "mt_add: arg 1: dtype i64");
    assert_null(mt_div(a, bo));
    assert_error(MT_ERR_DTYPE, "mt_div: arg 2: dtype bool");
    assert_null(mt_exp(i));
    assert_error(MT_ERR_DTYPE, "mt_exp: arg 1");
    assert_null(mt_add_scalar(bo, 1));
    assert_error(MT_ERR_DTYPE, "mt_add_scalar: arg 1");
    assert_null(mt_eq(i, a));
    assert_error(MT_ERR_DTYPE, "mt_eq");

    /* where: the condition must be bool */
    assert_null(mt_where(a, a, a));
    assert_error(MT_ERR_DTYPE, "mt_where: arg 1: condition must be bool, got f32");
    assert_null(mt_where(i, a, a));
    assert_error(MT_ERR_DTYPE, "i64");
    assert_null(mt_where(bo, a, i));
    assert_error(MT_ERR_DTYPE, "mt_where: arg 3");

    /* NULL in, NULL out, error untouched */
    assert_null(mt_add(NULL, a));
    assert_null(mt_exp(NULL));
    assert_null(mt_where(bo, NULL, a));
    assert_int_equal(mt_last_status(), MT_OK);

    /* the first error sticks */
    assert_null(mt_add(a, b));
    assert_null(mt_exp(i));
    assert_error(MT_ERR_SHAPE, "mt_add");
    mt_release(a);
    mt_release(b);
    mt_release(i);
    mt_release(bo);
}

/* pow's gradients at base 0 as torch 1.13 gives them (values printed by python3-torch for
   the same inputs): the base gradient is 0 where the exponent is 0 (0^0 included), the
   exponent gradient 0 where the base is 0 and the exponent >= 0, not 0 * inf = nan. */
static void test_pow_grad_at_zero(void **state) {
    (void)state;
    mt_tensor *a = mt_test_tensor((const double[]){0, 0, 2, 0}, MT_F64, MT_SHAPE(4));
    mt_tensor *b = mt_test_tensor((const double[]){0, 2, 3, -1}, MT_F64, MT_SHAPE(4));
    mt_set_requires_grad(a, true);
    mt_set_requires_grad(b, true);
    mt_tensor *y = mt_pow(a, b), *s = mt_sum_all(y);
    assert_int_equal(mt_backward(s, NULL), 0);
    mt_tensor *ga = mt_grad(a), *gb = mt_grad(b);
    assert_tensor_close(ga, ((const double[]){0, 0, 12, -INFINITY}), 4, 0, 1e-12);
    assert_tensor_close(gb, ((const double[]){0, 0, 8 * log(2.0), -INFINITY}), 4, 0, 1e-12);
    mt_tensor *x = mt_test_tensor((const double[]){0, 0, 2, 0}, MT_F64, MT_SHAPE(4));
    mt_set_requires_grad(x, true);
    mt_tensor *p = mt_pow_scalar(x, 0.0), *ps = mt_sum_all(p);
    assert_int_equal(mt_backward(ps, NULL), 0);
    mt_tensor *gx = mt_grad(x);
    assert_tensor_close(gx, ((const double[]){0, 0, 0, 0}), 4, 0, 0);
    mt_tensor *rel[] = {a, b, y, s, ga, gb, x, p, ps, gx};
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) mt_release(rel[i]);
    assert_no_error();
}

/* maximum/minimum gradients with a NaN operand and a tie, as torch 1.13 gives them (values
   printed by python3-torch): a NaN makes every comparison false, so both inputs get the whole
   gradient; a tie splits it. */
static void test_minmax_grad_nan(void **state) {
    (void)state;
    for (int is_max = 0; is_max < 2; is_max++) {
        mt_tensor *a = mt_test_tensor((const double[]){1, NAN, 2, 3}, MT_F64, MT_SHAPE(4));
        mt_tensor *b = mt_test_tensor((const double[]){2, 1, NAN, 3}, MT_F64, MT_SHAPE(4));
        mt_set_requires_grad(a, true);
        mt_set_requires_grad(b, true);
        mt_tensor *y = is_max ? mt_maximum(a, b) : mt_minimum(a, b), *s = mt_sum_all(y);
        assert_int_equal(mt_backward(s, NULL), 0);
        mt_tensor *ga = mt_grad(a), *gb = mt_grad(b);
        assert_tensor_close(
            ga, (is_max ? (const double[]){0, 1, 1, 0.5} : (const double[]){1, 1, 1, 0.5}), 4, 0,
            0);
        assert_tensor_close(
            gb, (is_max ? (const double[]){1, 1, 1, 0.5} : (const double[]){0, 1, 1, 0.5}), 4, 0,
            0);
        mt_tensor *rel[] = {a, b, y, s, ga, gb};
        for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) mt_release(rel[i]);
    }
    assert_no_error();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_binary_same_shape),
        MT_TEST(test_binary_broadcast),
        MT_TEST(test_binary_noncontiguous),
        MT_TEST(test_unary),
        MT_TEST(test_unary_special_values),
        MT_TEST(test_scalar_ops),
        MT_TEST(test_f32_accuracy),
        MT_TEST(test_large_parallel),
        MT_TEST(test_copy_layouts),
        MT_TEST(test_promotion),
        MT_TEST(test_where),
        MT_TEST(test_compare_integers),
        MT_TEST(test_gradcheck_binary),
        MT_TEST(test_gradcheck_unary),
        MT_TEST(test_gradcheck_where),
        MT_TEST(test_low_precision_backward),
        MT_TEST(test_gradcheck_copies),
        MT_TEST(test_errors),
        MT_TEST(test_errors_every_op),
        MT_TEST(test_pow_grad_at_zero),
        MT_TEST(test_minmax_grad_nan),
    };
    return MT_RUN_TESTS(tests);
}
