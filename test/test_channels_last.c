/* Channels-last tensors: layout, values, copies back, elementwise ops and reductions on NHWC
   strides, gradients through the copy, errors. */
#include "test_util.h"

/* A [2, 3, 4, 5] tensor of distinct values in dtype dt on the device under test. */
static mt_tensor *sample(mt_dtype dt) {
    double v[120];
    for (int i = 0; i < 120; i++) v[i] = (double)((i * 37) % 120) / 8.0 - 7.0;
    return mt_test_tensor(v, dt, MT_SHAPE(2, 3, 4, 5));
}

static void assert_same_values(const mt_tensor *a, const mt_tensor *b, double tol) {
    double *vb = mt_test_values(b);
    assert_tensor_close(a, vb, mt_numel(b), tol, tol);
    free(vb);
}

static void test_to_channels_last_layout(void **state) {
    (void)state;
    mt_tensor *x = sample(MT_F32);
    assert_false(mt_is_channels_last(x));
    mt_tensor *c = mt_to_channels_last(x);
    assert_no_error();
    assert_shape(c, 2, 3, 4, 5);
    assert_true(mt_is_channels_last(c));
    assert_false(mt_is_contiguous(c));
    const int64_t *s = mt_strides(c);
    assert_int_equal(s[0], 60);
    assert_int_equal(s[1], 1);
    assert_int_equal(s[2], 15);
    assert_int_equal(s[3], 3);
    assert_same_values(c, x, 0);
    /* already channels-last: the same tensor back */
    mt_tensor *again = mt_to_channels_last(c);
    assert_ptr_equal(again, c);
    /* and mt_contiguous turns it back into NCHW */
    mt_tensor *back = mt_contiguous(c);
    assert_true(mt_is_contiguous(back));
    assert_false(mt_is_channels_last(back));
    assert_same_values(back, x, 0);
    /* a permuted NHWC buffer is channels-last too (how torch data arrives) */
    mt_tensor *nhwc = mt_zeros(MT_SHAPE(2, 4, 5, 3), MT_F32, mt_test_device());
    mt_tensor *p = mt_permute(nhwc, MT_DIMS(0, 3, 1, 2));
    assert_true(mt_is_channels_last(p));
    assert_false(mt_is_channels_last(nhwc)); /* [2, 4, 5, 3] contiguous: C = 4 is not last */
    assert_no_error();
    mt_release(p);
    mt_release(nhwc);
    mt_release(back);
    mt_release(again);
    mt_release(c);
    mt_release(x);
}

static void test_channels_last_elementwise(void **state) {
    (void)state;
    mt_dtype dts[] = {MT_F32, MT_BF16, MT_F64};
    for (int k = 0; k < 3; k++) {
        mt_scope_begin();
        mt_tensor *x = sample(dts[k]), *c = mt_to_channels_last(x);
        mt_tensor *y = mt_mul_scalar(x, 0.5);
        mt_tensor *cy = mt_to_channels_last(y);
        /* every mix of formats gives the NCHW answer */
        assert_same_values(mt_add(c, cy), mt_add(x, y), 0);
        assert_same_values(mt_mul(c, y), mt_mul(x, y), 0);
        assert_same_values(mt_relu(c), mt_relu(x), 0);
        assert_same_values(mt_exp(mt_mul_scalar(c, 0.1)), mt_exp(mt_mul_scalar(x, 0.1)), 0);
        mt_tensor *bias = mt_test_tensor((const double[]){1, 2, 3}, dts[k], MT_SHAPE(1, 3, 1, 1));
        assert_same_values(mt_add(c, bias), mt_add(x, bias), 0);
        assert_same_values(mt_sum(c, MT_DIMS(0, 2, 3), false), mt_sum(x, MT_DIMS(0, 2, 3), false),
                           1e-6);
        assert_same_values(mt_mean(c, MT_DIMS(1), true), mt_mean(x, MT_DIMS(1), true), 1e-6);
        assert_same_values(mt_softmax(c, 1), mt_softmax(x, 1), 1e-6);
        assert_same_values(mt_cast(c, MT_F32), mt_cast(x, MT_F32), 0);
        assert_same_values(mt_reshape(c, MT_SHAPE(2, -1)), mt_reshape(x, MT_SHAPE(2, -1)), 0);
        assert_no_error();
        mt_scope_end();
    }
}

/* Elementwise results keep the format of their first full-shape input (torch's rule), so a
   channels-last network stays channels-last through its activations and residual adds. */
static void test_channels_last_elementwise_keeps_format(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = sample(MT_F32), *c = mt_to_channels_last(x);
    mt_tensor *bias = mt_zeros(MT_SHAPE(1, 3, 1, 1), MT_F32, mt_test_device());
    assert_true(mt_is_channels_last(mt_relu(c)));
    assert_true(mt_is_channels_last(mt_add(c, c)));
    assert_true(mt_is_channels_last(mt_add(c, bias)));
    assert_true(mt_is_channels_last(mt_add(bias, c))); /* the first full-shape input */
    assert_true(mt_is_contiguous(mt_add(x, c)));
    assert_true(mt_is_channels_last(mt_mul_scalar(c, 2.0)));
    assert_true(mt_is_channels_last(mt_gt(c, bias)));
    assert_true(mt_is_contiguous(mt_relu(x)));
    assert_same_values(mt_add(bias, c), x, 0);
    assert_no_error();
    mt_scope_end();
}

static void test_channels_last_grad(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = sample(MT_F32);
    mt_set_requires_grad(x, true);
    mt_tensor *c = mt_to_channels_last(x);
    assert_string_equal(mt_grad_fn_name(c), "to_channels_last");
    assert_int_equal(mt_backward(mt_sum_all(mt_mul(c, c)), NULL), 0);
    mt_tensor *g = mt_grad(x);
    assert_same_values(g, mt_mul_scalar(x, 2.0), 1e-6); /* g belongs to the scope */
    mt_scope_end();
    assert_no_error();
}

/* A channels-last gradient that the backward owns alone becomes the leaf's .grad as it is,
   as a contiguous one does (torch's layout contract): no copy, so the backward's peak grows
   by the one gradient, not by two or three of them. */
static void test_channels_last_grad_adopted(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *x = mt_to_channels_last(mt_ones(MT_SHAPE(2, 8, 16, 16), MT_F32, mt_test_device()));
    mt_set_requires_grad(x, true);
    mt_tensor *cot = mt_to_channels_last(mt_ones(MT_SHAPE(2, 8, 16, 16), MT_F32, mt_test_device()));
    mt_tensor *y = mt_mul_scalar(x, 3.0);
    int64_t bytes = 2 * 8 * 16 * 16 * (int64_t)sizeof(float);
    mt_peak_bytes_reset();
    int64_t before = mt_live_bytes();
    assert_int_equal(mt_backward(y, cot), 0);
    assert_true(mt_peak_bytes() - before < 2 * bytes);
    mt_tensor *g = mt_grad(x);
    assert_true(mt_is_channels_last(g) && !mt_is_contiguous(g));
    assert_same_values(g, mt_full(MT_SHAPE(2, 8, 16, 16), MT_F32, mt_test_device(), 3.0), 0);
    mt_scope_end();
    assert_no_error();
}

/* A dense leaf's .grad takes the leaf's layout whatever the last node produced (torch's
   layout contract): a channels-last parameter under a contiguous cotangent (a sum) gets a
   channels-last gradient, and a contiguous leaf whose gradient comes back channels-last gets
   a contiguous one. The optimizers' fast paths count on the parameter's layout. */
static void test_grad_takes_the_leafs_layout(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *w = mt_to_channels_last(mt_randn(MT_SHAPE(4, 3, 3, 3), MT_F32, mt_test_device()));
    mt_set_requires_grad(w, true);
    assert_int_equal(mt_backward(mt_sum_all(mt_mul_scalar(w, 2.0)), NULL), 0);
    mt_tensor *g = mt_grad(w);
    assert_true(mt_is_channels_last(g) && !mt_is_contiguous(g));
    assert_same_values(g, mt_full(MT_SHAPE(4, 3, 3, 3), MT_F32, mt_test_device(), 2.0), 0);
    mt_tensor *x = mt_randn(MT_SHAPE(2, 3, 4, 5), MT_F32, mt_test_device());
    mt_set_requires_grad(x, true);
    mt_tensor *cot = mt_to_channels_last(mt_ones(MT_SHAPE(2, 3, 4, 5), MT_F32, mt_test_device()));
    assert_int_equal(mt_backward(mt_mul_scalar(x, 3.0), cot), 0);
    g = mt_grad(x);
    assert_true(mt_is_contiguous(g));
    assert_same_values(g, mt_full(MT_SHAPE(2, 3, 4, 5), MT_F32, mt_test_device(), 3.0), 0);
    mt_scope_end();
    assert_no_error();
}

static mt_tensor *fn_cl(mt_tensor *const *in, void *ctx) {
    (void)ctx;
    return mt_mul(mt_to_channels_last(in[0]), in[1]);
}

static void test_channels_last_gradcheck(void **state) {
    (void)state;
    mt_tensor *in[2] = {sample(MT_F64), sample(MT_F64)};
    mt_set_requires_grad(in[0], true);
    mt_set_requires_grad(in[1], true);
    mt_scope_begin();
    int rc = mt_gradcheck(fn_cl, in, 2, NULL, NULL);
    mt_scope_end();
    if (rc) fail_msg("gradcheck: %s", mt_last_error());
    mt_release(in[0]);
    mt_release(in[1]);
}

static void test_channels_last_errors(void **state) {
    (void)state;
    mt_tensor *t = mt_zeros(MT_SHAPE(2, 3, 4), MT_F32, mt_test_device());
    assert_null(mt_to_channels_last(t));
    assert_error(MT_ERR_SHAPE, "mt_to_channels_last: arg 1: expected a 4-d tensor");
    assert_false(mt_is_channels_last(t));
    assert_false(mt_is_channels_last(NULL));
    assert_null(mt_to_channels_last(NULL));
    assert_no_error();
    mt_release(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_to_channels_last_layout),
        MT_TEST(test_channels_last_elementwise),
        MT_TEST(test_channels_last_elementwise_keeps_format),
        MT_TEST(test_channels_last_grad),
        MT_TEST(test_channels_last_grad_adopted),
        MT_TEST(test_grad_takes_the_leafs_layout),
        MT_TEST(test_channels_last_gradcheck),
        MT_TEST(test_channels_last_errors),
    };
    return MT_RUN_TESTS(tests);
}
