/* The nn layers of issue 9: batch norm 2d, layer norm, embedding and dropout initialised like
   torch.nn, their per-layer training flag, their error paths, and O2 decorate keeping the
   norm parameters FP32. */
#include "test_util.h"

static void assert_all(mt_tensor *t, double v) {
    int64_t n = mt_numel(t);
    double *e = malloc((size_t)n * sizeof *e);
    for (int64_t i = 0; i < n; i++) e[i] = v;
    assert_tensor_close(t, e, n, 0, 0);
    free(e);
}

static void test_batch_norm2d_layer_init(void **state) {
    (void)state;
    mt_batch_norm2d_layer l;
    assert_int_equal(mt_batch_norm2d_layer_init(&l, 3, MT_F32, mt_test_device()), 0);
    assert_shape(l.weight, 3);
    assert_all(l.weight, 1);
    assert_all(l.bias, 0);
    assert_all(l.running_mean, 0);
    assert_all(l.running_var, 1);
    assert_true(mt_requires_grad(l.weight) && mt_requires_grad(l.bias));
    assert_false(mt_requires_grad(l.running_mean) || mt_requires_grad(l.running_var));
    assert_true(mt_amp_keep_fp32(l.weight) && mt_amp_keep_fp32(l.bias));
    assert_true(l.training);
    assert_true(l.momentum == 0.1 && l.eps == 1e-5);
    mt_batch_norm2d_layer_free(&l);
    mt_batch_norm2d_layer_free(&l); /* twice is harmless */
    assert_int_equal(mt_batch_norm2d_layer_init(&l, 0, MT_F32, mt_test_device()), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "channels must be positive, got 0");
    assert_int_equal(mt_batch_norm2d_layer_init(&l, 2, MT_I64, mt_test_device()), MT_ERR_DTYPE);
    assert_error(MT_ERR_DTYPE, "parameters must be floating");
    assert_int_equal(mt_batch_norm2d_layer_init(NULL, 2, MT_F32, mt_test_device()), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "layer is NULL");
}

static void test_batch_norm2d_layer_forward(void **state) {
    (void)state;
    mt_scope_begin();
    mt_batch_norm2d_layer l;
    assert_int_equal(mt_batch_norm2d_layer_init(&l, 2, MT_F32, mt_test_device()), 0);
    /* channel 0 holds 1..4 per sample, channel 1 the negatives */
    double v[16];
    for (int n = 0; n < 2; n++)
        for (int c = 0; c < 2; c++)
            for (int i = 0; i < 4; i++) v[(n * 2 + c) * 4 + i] = (c ? -1 : 1) * (i + 1 + 4 * n);
    mt_tensor *x = mt_test_tensor(v, MT_F32, MT_SHAPE(2, 2, 2, 2));
    mt_tensor *y = mt_batch_norm2d_layer_forward(&l, x);
    assert_no_error();
    /* batch mean +-4.5, unbiased var 6: running = 0.9 * init + 0.1 * batch */
    double rm[2] = {0.45, -0.45}, rv[2] = {0.9 + 0.6, 0.9 + 0.6};
    assert_tensor_close(l.running_mean, rm, 2, 1e-6, 1e-6);
    assert_tensor_close(l.running_var, rv, 2, 1e-6, 1e-6);
    double *yv = mt_test_values(y), s = 0;
    for (int i = 0; i < 16; i++) s += yv[i];
    assert_true(fabs(s) < 1e-5); /* normalised */
    free(yv);
    /* eval: the running statistics, no update */
    l.training = false;
    y = mt_batch_norm2d_layer_forward(&l, x);
    assert_tensor_close(l.running_mean, rm, 2, 1e-6, 1e-6);
    double first = (1 - 0.45) / sqrt(1.5 + 1e-5);
    assert_tensor_close(mt_narrow(mt_flatten(y), 0, 0, 1), &first, 1, 1e-6, 1e-6);
    assert_null(
        mt_batch_norm2d_layer_forward(&l, mt_zeros(MT_SHAPE(2, 2), MT_F32, mt_test_device())));
    assert_error(MT_ERR_SHAPE, "expected a 4-d [N, C, H, W] input, got 2 dims");
    mt_batch_norm2d_layer_free(&l);
    assert_null(mt_batch_norm2d_layer_forward(&l, x));
    assert_error(MT_ERR_STATE, "not initialised");
    mt_scope_end();
}

static void test_layer_norm_layer(void **state) {
    (void)state;
    mt_scope_begin();
    mt_layer_norm_layer l;
    assert_int_equal(
        mt_layer_norm_layer_init(&l, 2, (const int64_t[]){3, 4}, true, MT_F32, mt_test_device()),
        0);
    assert_shape(l.weight, 3, 4);
    assert_all(l.weight, 1);
    assert_all(l.bias, 0);
    assert_true(mt_amp_keep_fp32(l.weight));
    mt_tensor *x = mt_randn(MT_SHAPE(2, 3, 4), MT_F32, mt_test_device());
    mt_tensor *y = mt_layer_norm_layer_forward(&l, x);
    mt_tensor *ref = mt_layer_norm(x, 2, NULL, NULL, 1e-5);
    double *rv = mt_test_values(ref);
    assert_tensor_close(y, rv, 24, 0, 0);
    free(rv);
    mt_layer_norm_layer_free(&l);
    assert_int_equal(
        mt_layer_norm_layer_init(&l, 1, (const int64_t[]){5}, false, MT_F32, mt_test_device()), 0);
    assert_null(l.weight);
    assert_null(mt_layer_norm_layer_forward(&l, x));
    assert_error(MT_ERR_SHAPE, "input [2, 3, 4] does not end with the normalized shape [5]");
    mt_layer_norm_layer_free(&l);
    assert_int_equal(
        mt_layer_norm_layer_init(&l, 1, (const int64_t[]){0}, true, MT_F32, mt_test_device()),
        MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "size 0 of dim 0 is not positive");
    assert_int_equal(mt_layer_norm_layer_init(&l, 1, NULL, true, MT_F32, mt_test_device()),
                     MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "arg 3: normalized shape is NULL");
    assert_int_equal(
        mt_layer_norm_layer_init(&l, 0, (const int64_t[]){5}, true, MT_F32, mt_test_device()),
        MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "normalized shape needs 1 to 8 dims, got 0");
    /* a public field set out of range reads as an uninitialised layer (the shape message
       read past the shape) */
    assert_int_equal(
        mt_layer_norm_layer_init(&l, 1, (const int64_t[]){3}, true, MT_F32, mt_test_device()), 0);
    l.ndim = 12;
    assert_null(mt_layer_norm_layer_forward(&l, mt_ones(MT_SHAPE(2, 3), MT_F32, mt_test_device())));
    assert_error(MT_ERR_STATE, "not initialised");
    l.ndim = 1;
    mt_layer_norm_layer_free(&l);
    mt_scope_end();
}

static void test_embedding_layer(void **state) {
    (void)state;
    mt_scope_begin();
    mt_manual_seed(42);
    mt_embedding_layer l;
    assert_int_equal(mt_embedding_layer_init(&l, 100, 200, MT_BF16, mt_test_device()), 0);
    assert_int_equal(mt_dtype_of(l.weight), MT_BF16);
    assert_true(mt_requires_grad(l.weight));
    double *w = mt_test_values(l.weight), m = 0, q = 0;
    for (int i = 0; i < 20000; i++) {
        m += w[i] / 20000;
        q += w[i] * w[i] / 20000;
    }
    free(w);
    assert_true(fabs(m) < 0.03 && fabs(q - 1) < 0.05); /* N(0, 1) */
    int64_t idx[3] = {99, 0, 7};
    mt_tensor *y =
        mt_embedding_layer_forward(&l, mt_from_data(idx, MT_I64, MT_SHAPE(3), mt_test_device()));
    assert_shape(y, 3, 200);
    mt_embedding_layer_free(&l);
    assert_int_equal(mt_embedding_layer_init(&l, 0, 4, MT_F32, mt_test_device()), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "must be positive");
    mt_scope_end();
}

static void test_dropout_layer(void **state) {
    (void)state;
    mt_scope_begin();
    mt_dropout_layer l;
    assert_int_equal(mt_dropout_layer_init(&l, 0.5), 0);
    assert_true(l.training);
    mt_tensor *x = mt_ones(MT_SHAPE(1000), MT_F32, mt_test_device());
    double *y = mt_test_values(mt_dropout_layer_forward(&l, x));
    int zeros = 0;
    for (int i = 0; i < 1000; i++) zeros += y[i] == 0;
    free(y);
    assert_true(zeros > 400 && zeros < 600);
    l.training = false;
    assert_ptr_equal(mt_dropout_layer_forward(&l, x), x);
    assert_int_equal(mt_dropout_layer_init(&l, -0.5), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "p -0.5 must be in [0, 1]");
    mt_scope_end();
}

/* O2 decorate casts the linear layer and keeps the norm layers' parameters FP32; a step
   then runs with a low-precision activation through FP32-parameter batch norm. */
static void test_decorate_keeps_norms(void **state) {
    (void)state;
    mt_scope_begin();
    mt_linear_layer lin;
    mt_batch_norm2d_layer bn;
    mt_layer_norm_layer ln;
    mt_device dev = mt_test_device();
    assert_int_equal(mt_linear_layer_init(&lin, 4, 4, true, MT_F32, dev), 0);
    assert_int_equal(mt_batch_norm2d_layer_init(&bn, 2, MT_F32, dev), 0);
    assert_int_equal(mt_layer_norm_layer_init(&ln, 1, (const int64_t[]){4}, true, MT_F32, dev), 0);
    mt_tensor *ps[6] = {lin.weight, lin.bias, bn.weight, bn.bias, ln.weight, ln.bias};
    assert_int_equal(mt_amp_decorate(ps, 6, MT_F16, NULL), 0);
    assert_int_equal(mt_dtype_of(lin.weight), MT_F16);
    assert_int_equal(mt_dtype_of(lin.bias), MT_F16);
    for (int i = 2; i < 6; i++) assert_int_equal(mt_dtype_of(ps[i]), MT_F32);
    assert_int_equal(mt_dtype_of(bn.running_mean), MT_F32);
    mt_autocast_begin(MT_F16, MT_AMP_O2);
    mt_tensor *x = mt_randn(MT_SHAPE(3, 2, 2, 4), MT_F32, dev);
    mt_tensor *h = mt_linear_layer_forward(&lin, x); /* low */
    mt_tensor *y = mt_layer_norm_layer_forward(&ln, mt_batch_norm2d_layer_forward(&bn, h));
    mt_autocast_end();
    assert_no_error();
    assert_int_equal(mt_dtype_of(h), MT_F16);
    assert_int_equal(mt_dtype_of(y), MT_F16);
    assert_int_equal(mt_backward(mt_sum_all(mt_cast(y, MT_F32)), NULL), 0);
    mt_tensor *g = mt_grad(bn.weight);
    assert_non_null(g);
    assert_int_equal(mt_dtype_of(g), MT_F32);
    mt_linear_layer_free(&lin);
    mt_batch_norm2d_layer_free(&bn);
    mt_layer_norm_layer_free(&ln);
    mt_scope_end();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_batch_norm2d_layer_init), MT_TEST(test_batch_norm2d_layer_forward),
        MT_TEST(test_layer_norm_layer),        MT_TEST(test_embedding_layer),
        MT_TEST(test_dropout_layer),           MT_TEST(test_decorate_keeps_norms),
    };
    return MT_RUN_TESTS(tests);
}
