/* mt_dropout: the kept fraction and scaling, the backward mask equal to the forward one, the
   same seed giving the same mask, low precision without up-cast, eval mode, F64 finite
   differences and the error paths. */
#include "test_util.h"

static void test_dropout_statistics(void **state) {
    (void)state;
    mt_scope_begin();
    const double p = 0.3;
    mt_manual_seed(123);
    mt_tensor *x = mt_full(MT_SHAPE(200, 500), MT_F32, mt_test_device(), 2.0);
    mt_tensor *y = mt_dropout(x, p, true);
    assert_no_error();
    double *v = mt_test_values(y);
    int64_t kept = 0;
    for (int64_t i = 0; i < 100000; i++) {
        if (v[i] == 0) continue;
        kept++;
        if (v[i] != (double)(2.0f * (float)(1.0 / (1.0 - p))))
            fail_msg("element %lld is %g, want 0 or 2 / (1 - p)", (long long)i, v[i]);
    }
    double frac = (double)kept / 100000.0; /* binomial: sd 0.0014 */
    if (fabs(frac - (1 - p)) > 0.01) fail_msg("kept fraction %g, want %g", frac, 1 - p);
    free(v);
    mt_scope_end();
}

/* The gradient of sum(dropout(x)) is the mask times the scale: the same elements. */
static void test_dropout_backward_mask(void **state) {
    (void)state;
    mt_dtype dts[4] = {MT_F32, MT_F64, MT_F16, MT_BF16};
    for (int k = 0; k < 4; k++) {
        mt_scope_begin();
        mt_tensor *x = mt_ones(MT_SHAPE(37, 29), dts[k], mt_test_device());
        mt_set_requires_grad(x, true);
        mt_tensor *y = mt_dropout(x, 0.5, true);
        assert_int_equal(mt_dtype_of(y), dts[k]);
        assert_string_equal(mt_grad_fn_name(y), "dropout");
        assert_int_equal(mt_backward(mt_sum_all(y), NULL), 0);
        mt_tensor *g = mt_grad(x);
        assert_int_equal(mt_dtype_of(g), dts[k]);
        double *yv = mt_test_values(y);
        assert_tensor_close(g, yv, 37 * 29, 0, 0);
        free(yv);
        mt_scope_end();
    }
}

static void test_dropout_seed(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = mt_ones(MT_SHAPE(1000), MT_BF16, mt_test_device());
    mt_manual_seed(7);
    mt_tensor *a = mt_dropout(x, 0.4, true), *b = mt_dropout(x, 0.4, true);
    mt_manual_seed(7);
    mt_tensor *c = mt_dropout(x, 0.4, true);
    double *av = mt_test_values(a), *bv = mt_test_values(b);
    assert_tensor_close(c, av, 1000, 0, 0); /* same seed, same mask */
    int differ = 0;
    for (int i = 0; i < 1000; i++) differ += av[i] != bv[i];
    assert_true(differ > 100); /* the next call draws fresh numbers */
    free(av);
    free(bv);
    mt_scope_end();
}

static void test_dropout_eval_and_edges(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = mt_full(MT_SHAPE(3, 4), MT_F16, mt_test_device(), 1.5);
    assert_ptr_equal(mt_dropout(x, 0.5, false), x);
    assert_ptr_equal(mt_dropout(x, 0.0, true), x);
    mt_tensor *z = mt_dropout(x, 1.0, true);
    double zero[12] = {0};
    assert_tensor_close(z, zero, 12, 0, 0);
    /* a non-contiguous input: the mask follows the logical order */
    mt_tensor *t = mt_transpose(mt_ones(MT_SHAPE(4, 3), MT_F32, mt_test_device()), 0, 1);
    mt_manual_seed(9);
    mt_tensor *a = mt_dropout(t, 0.5, true);
    mt_manual_seed(9);
    mt_tensor *b = mt_dropout(mt_contiguous(t), 0.5, true);
    double *bv = mt_test_values(b);
    assert_tensor_close(a, bv, 12, 0, 0);
    free(bv);
    mt_scope_end();
}

/* Non-finite values, as torch (x * mask * scale): a kept inf stays inf, a kept NaN NaN, and a
   dropped one is NaN (0 * inf), not 0, so an overflow is not hidden from the GradScaler. The
   gradient is the incoming one times the same factor. Every floating dtype. */
static void test_dropout_nonfinite(void **state) {
    (void)state;
    const mt_dtype dts[4] = {MT_F32, MT_F64, MT_F16, MT_BF16};
    for (int k = 0; k < 4; k++) {
        mt_scope_begin();
        double v[64], ones[64];
        for (int i = 0; i < 64; i++) {
            v[i] = i % 3 == 0 ? INFINITY : i % 3 == 1 ? NAN : 1.0;
            ones[i] = 1.0;
        }
        mt_manual_seed(11);
        mt_tensor *m = mt_dropout(mt_test_tensor(ones, dts[k], MT_SHAPE(64)), 0.5, true);
        mt_manual_seed(11);
        mt_tensor *x = mt_test_param(v, dts[k], MT_SHAPE(64));
        mt_tensor *y = mt_dropout(x, 0.5, true);
        assert_int_equal(mt_backward(y, mt_test_tensor(v, dts[k], MT_SHAPE(64))), 0);
        double *mv = mt_test_values(m), *yv = mt_test_values(y), *gv = mt_test_values(mt_grad(x));
        int dropped = 0;
        for (int i = 0; i < 64; i++) {
            bool kept = mv[i] != 0;
            dropped += !kept;
            double want = kept ? v[i] * 2 : v[i] * 0; /* 0 * inf and 0 * NaN are NaN */
            if (!(isnan(want) ? isnan(yv[i]) && isnan(gv[i]) : yv[i] == want && gv[i] == want))
                fail_msg("%s element %d (%s): output %g, gradient %g, want %g",
                         mt_dtype_name(dts[k]), i, kept ? "kept" : "dropped", yv[i], gv[i], want);
        }
        assert_true(dropped > 10 && dropped < 54);
        free(mv);
        free(yv);
        free(gv);
        assert_no_error();
        mt_scope_end();
    }
}

static mt_tensor *dropout_fn(mt_tensor *const *in, void *ctx) {
    (void)ctx;
    mt_manual_seed(77); /* the same mask at every evaluation */
    return mt_dropout(in[0], 0.25, true);
}

static void test_dropout_gradcheck(void **state) {
    (void)state;
    mt_scope_begin();
    mt_manual_seed(3);
    mt_tensor *x = mt_randn(MT_SHAPE(4, 6), MT_F64, mt_test_device());
    mt_set_requires_grad(x, true);
    if (mt_gradcheck(dropout_fn, &x, 1, NULL, NULL)) fail_msg("%s", mt_last_error());
    mt_scope_end();
}

static void test_dropout_errors(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = mt_ones(MT_SHAPE(3), MT_F32, mt_test_device());
    assert_null(mt_dropout(NULL, 0.5, true));
    assert_int_equal(mt_last_status(), MT_OK);
    assert_null(mt_dropout(x, 1.5, true));
    assert_error(MT_ERR_INVALID, "mt_dropout: arg 2: p 1.5 must be in [0, 1]");
    assert_null(mt_dropout(x, NAN, true));
    assert_error(MT_ERR_INVALID, "p nan");
    assert_null(mt_dropout(mt_zeros(MT_SHAPE(3), MT_I64, mt_test_device()), 0.5, true));
    assert_error(MT_ERR_DTYPE, "mt_dropout");
    mt_scope_end();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_dropout_statistics), MT_TEST(test_dropout_backward_mask),
        MT_TEST(test_dropout_seed),       MT_TEST(test_dropout_eval_and_edges),
        MT_TEST(test_dropout_nonfinite),  MT_TEST(test_dropout_gradcheck),
        MT_TEST(test_dropout_errors),
    };
    return MT_RUN_TESTS(tests);
}
