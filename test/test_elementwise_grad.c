/* Elementwise ops: FP64 gradient checks of every binary, unary, scalar op, where and the copies,
   low-precision backward, gradients at kinks, and the error paths of every op. Forward values:
   test_elementwise.c. */
#include "elementwise_cases.h"

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
        MT_TEST(test_gradcheck_binary), MT_TEST(test_gradcheck_unary),
        MT_TEST(test_gradcheck_where),  MT_TEST(test_low_precision_backward),
        MT_TEST(test_gradcheck_copies), MT_TEST(test_errors),
        MT_TEST(test_errors_every_op),  MT_TEST(test_pow_grad_at_zero),
        MT_TEST(test_minmax_grad_nan),
    };
    return MT_RUN_TESTS(tests);
}
