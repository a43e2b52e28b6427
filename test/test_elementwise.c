/* Elementwise ops: every binary, scalar, unary and comparison op and where, against loops in
   double, in F64 and F32; F16/BF16 equal the F32 result rounded to the low dtype;
   broadcasting, non-contiguous inputs and dtype promotion. Gradients and errors:
   test_elementwise_grad.c. */
#include "elementwise_cases.h"
#include "../src/math/scalar_ops.h" /* the formulas, compiled here without clones */

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

/* Where torch's result hangs on the sign of zero or on which root function it takes: tanh
   keeps -0 in every dtype, and pow_scalar with 0.5 and -0.5 is sqrt and rsqrt (pow itself
   gives +0 and inf at -0, and inf and 0 at -inf), forward and gradient. */
static void test_signed_zero_and_pow_roots(void **state) {
    (void)state;
    mt_scope_begin();
    const mt_dtype dts[] = {MT_F32, MT_F16, MT_BF16, MT_F64};
    for (int k = 0; k < 4; k++) {
        const double x[3] = {-0.0, -INFINITY, 4};
        mt_tensor *t = mt_test_tensor(x, dts[k], MT_SHAPE(3));
        double *th = mt_test_values(mt_tanh(t));
        assert_true(th[0] == 0 && signbit(th[0]));
        free(th);
        mt_set_requires_grad(t, true);
        mt_tensor *r = mt_pow_scalar(t, 0.5), *rr = mt_pow_scalar(t, -0.5);
        double *vr = mt_test_values(r), *vrr = mt_test_values(rr);
        assert_true(vr[0] == 0 && signbit(vr[0])); /* sqrt(-0) = -0 */
        assert_true(isnan(vr[1]) && vr[2] == 2);
        assert_true(isinf(vrr[0]) && vrr[0] < 0); /* 1 / sqrt(-0) = -inf */
        assert_true(isnan(vrr[1]) && vrr[2] == 0.5);
        free(vr);
        free(vrr);
        assert_int_equal(mt_backward(mt_sum_all(r), NULL), 0);
        double *g = mt_test_values(mt_grad(t)); /* 0.5 * x^-0.5 */
        assert_true(isinf(g[0]) && g[0] < 0);
        assert_true(isnan(g[1]) && g[2] == 0.25);
        free(g);
    }
    mt_scope_end();
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
/* On the CPU the elementwise loops run in the clone for this CPU's x86-64 level (AVX2,
   AVX-512 or baseline; see MT_CPU_CLONES in src/cpu/cpu.h), which must give the bits of
   src/math's formula compiled plainly, as this test is: same formula, no contraction, no
   library call that differs. Softmax's exp run and the lane reductions are checked by their
   own tests' tolerances only. */
typedef struct {
    const char *name;
    unary_fn fn;
    float (*formula)(float);
    float lo, hi;
} clone_case;

static void test_cpu_clones_match_formulas(void **state) {
    (void)state;
    mt_device d = mt_test_device();
    const clone_case cases[] = {
        {"exp", mt_exp, mt_exp_f, -100, 90},
        {"log", mt_log, mt_log_f, 0, 1e30f},
        {"sqrt", mt_sqrt, mt_sqrt_f, 0, 1e30f},
        {"rsqrt", mt_rsqrt, mt_rsqrt_f, 1e-30f, 1e30f},
        {"tanh", mt_tanh, mt_tanh_f, -20, 20},
        {"sigmoid", mt_sigmoid, mt_sigmoid_f, -90, 90},
        {"gelu", mt_gelu, mt_gelu_f, -12, 12},
        {"gelu_tanh", mt_gelu_tanh, mt_gelu_tanh_f, -12, 12},
        {"relu", mt_relu, mt_relu_f, -1e30f, 1e30f},
    };
    const int64_t n = 4099; /* not a multiple of any vector width: the tails run too */
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const clone_case *c = &cases[k];
        for (int64_t i = 0; i < n; i++)
            x[i] = c->lo + (c->hi - c->lo) * (float)((double)i / (double)(n - 1));
        mt_tensor *t = mt_from_data(x, MT_F32, MT_SHAPE(n), d), *r = c->fn(t);
        assert_no_error();
        assert_int_equal(mt_copy_to_host(r, y, (size_t)n * sizeof *y), 0);
        for (int64_t i = 0; i < n; i++) {
            float want = c->formula(x[i]);
            if (memcmp(&want, &y[i], sizeof want) != 0)
                fail_msg("%s(%a): the CPU kernel gives %a, src/math's formula %a", c->name,
                         (double)x[i], (double)y[i], (double)want);
        }
        mt_release(t);
        mt_release(r);
    }
    free(x);
    free(y);
}

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

/* src/math's sin and cos of 2 pi t (Box-Muller's angle in mt_randn on every device): within
   2 ulp of the double result for t = k / 2^24 in [0, 1), every 7th k (the values a 24-bit
   uniform takes), exact at the quarter turns. A host formula: checked once, on the CPU. */
static void test_sincos_turns(void **state) {
    (void)state;
    double worst = 0;
    for (int64_t k = 0; k < ((int64_t)1 << 24); k += 7) {
        float t = (float)k * 0x1p-24f;
        if (k % ((int64_t)1 << 22) == 0) continue; /* the quarter turns, below */
        for (int want_sin = 0; want_sin < 2; want_sin++) {
            double e = want_sin ? sin(2 * M_PI * (double)t) : cos(2 * M_PI * (double)t);
            float got = mt_sincos_turns_f(t, want_sin);
            int ex;
            frexp(e, &ex);
            double err = fabs(got - e) / ldexp(1, ex - 24);
            if (err > worst) worst = err;
            if (err > 2.0)
                fail_msg("%s(2 pi %a) = %a, expected %a (%.2f ulp)", want_sin ? "sin" : "cos",
                         (double)t, (double)got, e, err);
        }
    }
    assert_true(worst > 0.5); /* it compared rounded values */
    const float quarter[] = {0.0f, 0.25f, 0.5f, 0.75f}, sin_q[] = {0, 1, 0, -1},
                cos_q[] = {1, 0, -1, 0};
    for (int q = 0; q < 4; q++) {
        assert_true(mt_sincos_turns_f(quarter[q], 1) == sin_q[q]);
        assert_true(mt_sincos_turns_f(quarter[q], 0) == cos_q[q]);
    }
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
    /* a 0-d operand counts only when no operand with dims is floating (torch's result_type):
       f16 [4] with an f64 0-d is f16; two 0-d promote; an I64 [2] with a 0-d f64 is f64 */
    mt_scope_begin();
    mt_tensor *h4 = mt_full(MT_SHAPE(4), MT_F16, mt_test_device(), 1.5);
    mt_tensor *d0 = mt_scalar(2, MT_F64, mt_test_device()), *f0 = mt_scalar(2, MT_F32, MT_CPU);
    assert_int_equal(mt_dtype_of(mt_mul(h4, d0)), MT_F16);
    assert_int_equal(mt_dtype_of(mt_add(f0, h4)), MT_F16);
    assert_int_equal(mt_dtype_of(mt_maximum(h4, d0)), MT_F16);
    assert_int_equal(mt_dtype_of(mt_where(mt_gt(h4, d0), h4, d0)), MT_F16);
    assert_tensor_close(mt_mul(h4, d0), ((const double[]){3, 3, 3, 3}), 4, 0, 0);
    assert_int_equal(mt_dtype_of(mt_add(mt_scalar(1, MT_BF16, mt_test_device()),
                                        mt_scalar(1, MT_F16, mt_test_device()))),
                     MT_F32);
    assert_int_equal(mt_dtype_of(mt_mul(mt_full(MT_SHAPE(1), MT_F16, mt_test_device(), 1), d0)),
                     MT_F16); /* a [1] tensor has a dim: it decides */
    assert_no_error();
    mt_scope_end();
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

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_binary_same_shape),
        MT_TEST(test_binary_broadcast),
        MT_TEST(test_binary_noncontiguous),
        MT_TEST(test_unary),
        MT_TEST(test_unary_special_values),
        MT_TEST(test_signed_zero_and_pow_roots),
        MT_TEST(test_scalar_ops),
        MT_TEST(test_f32_accuracy),
        MT_TEST_CPU_ONLY(test_cpu_clones_match_formulas,
                         "CPU clones only (the GPU's compiler contracts differently)"),
        MT_TEST_CPU_ONLY(test_sincos_turns, "a host formula, checked once"),
        MT_TEST(test_large_parallel),
        MT_TEST(test_copy_layouts),
        MT_TEST(test_promotion),
        MT_TEST(test_where),
        MT_TEST(test_compare_integers),
    };
    return MT_RUN_TESTS(tests);
}
