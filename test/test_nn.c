/* nn layers: the linear layer's initialisation (torch.nn.Linear's bounds, seeding, leaves
   that require grad), forward against loops, gradients, autocast and error paths. */
#include "test_util.h"

static double *values(const mt_tensor *t) {
    return mt_test_values(t);
}

static void test_init_shapes_and_flags(void **state) {
    (void)state;
    mt_linear_layer l;
    assert_int_equal(mt_linear_layer_init(&l, 128, 64, true, MT_F32, mt_test_device()), 0);
    assert_shape(l.weight, 64, 128);
    assert_shape(l.bias, 64);
    assert_int_equal(mt_dtype_of(l.weight), MT_F32);
    assert_on_test_device(l.weight);
    assert_on_test_device(l.bias);
    assert_true(mt_requires_grad(l.weight) && mt_requires_grad(l.bias));
    assert_true(mt_is_leaf(l.weight) && mt_is_leaf(l.bias));
    mt_linear_layer_free(&l);
    assert_null(l.weight);
    assert_null(l.bias);
    mt_linear_layer_free(&l); /* twice is harmless */

    assert_int_equal(mt_linear_layer_init(&l, 3, 2, false, MT_BF16, mt_test_device()), 0);
    assert_null(l.bias);
    assert_int_equal(mt_dtype_of(l.weight), MT_BF16);
    mt_linear_layer_free(&l);
}

/* U(-1/sqrt(in), 1/sqrt(in)) for weight and bias, like torch.nn.Linear. */
static void test_init_distribution(void **state) {
    (void)state;
    mt_manual_seed(7);
    mt_linear_layer l;
    int64_t in = 100, out = 200;
    assert_int_equal(mt_linear_layer_init(&l, in, out, true, MT_F64, mt_test_device()), 0);
    double bound = 1.0 / sqrt((double)in);
    double *w = values(l.weight), *b = values(l.bias);
    double lo = 1, hi = -1, mean = 0, sq = 0;
    for (int64_t i = 0; i < in * out; i++) {
        assert_true(w[i] >= -bound && w[i] < bound);
        lo = fmin(lo, w[i]);
        hi = fmax(hi, w[i]);
        mean += w[i];
        sq += w[i] * w[i];
    }
    mean /= (double)(in * out);
    sq /= (double)(in * out);
    assert_true(lo < -0.99 * bound && hi > 0.99 * bound);
    assert_true(fabs(mean) < 0.02 * bound);
    /* variance of U(-c, c) is c^2 / 3 */
    assert_true(fabs(sq - bound * bound / 3) < 0.03 * bound * bound);
    double blo = 1, bhi = -1;
    for (int64_t i = 0; i < out; i++) {
        assert_true(b[i] >= -bound && b[i] < bound);
        blo = fmin(blo, b[i]);
        bhi = fmax(bhi, b[i]);
    }
    assert_true(blo < -0.8 * bound && bhi > 0.8 * bound);
    free(w);
    free(b);
    mt_linear_layer_free(&l);
}

static void test_init_seeded(void **state) {
    (void)state;
    mt_linear_layer l1, l2, l3;
    mt_manual_seed(42);
    assert_int_equal(mt_linear_layer_init(&l1, 8, 4, true, MT_F32, mt_test_device()), 0);
    mt_manual_seed(42);
    assert_int_equal(mt_linear_layer_init(&l2, 8, 4, true, MT_F32, mt_test_device()), 0);
    assert_int_equal(mt_linear_layer_init(&l3, 8, 4, true, MT_F32, mt_test_device()), 0);
    double *a = values(l1.weight), *b = values(l2.weight), *c = values(l3.weight);
    assert_memory_equal(a, b, 32 * sizeof(double));
    assert_memory_not_equal(a, c, 32 * sizeof(double));
    /* the caller's autocast region and lists do not reach the init (they rounded the draw
       to f16 when mul_scalar was white-listed) */
    mt_linear_layer l4;
    assert_int_equal(
        mt_autocast_set_lists((const char *[]){"mul_scalar", "add_scalar", NULL}, NULL), 0);
    mt_autocast_begin(MT_F16, MT_AMP_O1);
    mt_manual_seed(42);
    assert_int_equal(mt_linear_layer_init(&l4, 8, 4, true, MT_F32, mt_test_device()), 0);
    mt_autocast_end();
    assert_int_equal(mt_autocast_set_lists(NULL, NULL), 0);
    double *d = values(l4.weight);
    assert_memory_equal(a, d, 32 * sizeof(double));
    free(d);
    mt_linear_layer_free(&l4);
    free(a);
    free(b);
    free(c);
    mt_linear_layer_free(&l1);
    mt_linear_layer_free(&l2);
    mt_linear_layer_free(&l3);
}

static void test_forward_reference(void **state) {
    (void)state;
    const mt_dtype dts[] = {MT_F64, MT_F32, MT_F16, MT_BF16};
    const double tol[] = {1e-12, 1e-5, 4e-3, 3e-2};
    for (int d = 0; d < 4; d++) {
        mt_linear_layer l;
        assert_int_equal(mt_linear_layer_init(&l, 6, 5, true, dts[d], mt_test_device()), 0);
        mt_tensor *x = mt_randn(MT_SHAPE(2, 3, 6), dts[d], mt_test_device());
        mt_tensor *y = mt_linear_layer_forward(&l, x);
        assert_shape(y, 2, 3, 5);
        assert_int_equal(mt_dtype_of(y), dts[d]);
        double *xv = values(x), *wv = values(l.weight), *bv = values(l.bias), ref[30];
        for (int r = 0; r < 6; r++)
            for (int o = 0; o < 5; o++) {
                ref[r * 5 + o] = bv[o];
                for (int i = 0; i < 6; i++) ref[r * 5 + o] += xv[r * 6 + i] * wv[o * 6 + i];
            }
        assert_tensor_close(y, ref, 30, tol[d], tol[d]);
        free(xv);
        free(wv);
        free(bv);
        mt_release(x);
        mt_release(y);
        mt_linear_layer_free(&l);
    }
}

static mt_linear_layer *gc_layer;
static mt_tensor *fn_layer(mt_tensor *const *in, void *ctx) {
    (void)ctx;
    (void)in;
    return mt_linear_layer_forward(gc_layer, in[0]);
}

static void test_gradcheck_layer(void **state) {
    (void)state;
    mt_linear_layer l;
    assert_int_equal(mt_linear_layer_init(&l, 4, 3, true, MT_F64, mt_test_device()), 0);
    mt_tensor *x = mt_randn(MT_SHAPE(2, 5, 4), MT_F64, mt_test_device());
    mt_set_requires_grad(x, true);
    gc_layer = &l;
    mt_tensor *in[3] = {x, l.weight, l.bias};
    if (mt_gradcheck(fn_layer, in, 3, NULL, NULL)) fail_msg("gradcheck: %s", mt_last_error());
    mt_release(x);
    mt_linear_layer_free(&l);
}

/* A few plain gradient steps on a least-squares problem reduce the loss. */
static void test_training_reduces_loss(void **state) {
    (void)state;
    mt_manual_seed(3);
    mt_linear_layer l;
    assert_int_equal(mt_linear_layer_init(&l, 8, 2, true, MT_F32, mt_test_device()), 0);
    mt_tensor *x = mt_randn(MT_SHAPE(32, 8), MT_F32, mt_test_device());
    mt_tensor *t = mt_randn(MT_SHAPE(32, 2), MT_F32, mt_test_device());
    double first = 0, last = 0;
    for (int step = 0; step < 20; step++) {
        mt_scope_begin();
        mt_tensor *y = mt_linear_layer_forward(&l, x);
        mt_tensor *d = mt_sub(y, t);
        mt_tensor *loss = mt_mean_all(mt_mul(d, d));
        double v = mt_item(loss);
        if (step == 0) first = v;
        last = v;
        assert_int_equal(mt_backward(loss, NULL), 0);
        mt_tensor *ps[2] = {l.weight, l.bias};
        bool prev = mt_set_grad_enabled(false);
        for (int i = 0; i < 2; i++) {
            mt_tensor *g = mt_grad(ps[i]);
            mt_tensor *u = mt_mul_scalar(g, -0.1);
            assert_int_equal(mt_add_inplace(ps[i], u), 0);
            mt_zero_grad(ps[i]);
        }
        mt_set_grad_enabled(prev);
        mt_scope_end();
    }
    assert_no_error();
    assert_true(last < 0.7 * first);
    mt_release(x);
    mt_release(t);
    mt_linear_layer_free(&l);
}

static void test_autocast_layer(void **state) {
    (void)state;
    mt_linear_layer l;
    assert_int_equal(mt_linear_layer_init(&l, 16, 8, true, MT_F32, mt_test_device()), 0);
    mt_tensor *x = mt_randn(MT_SHAPE(4, 16), MT_F32, mt_test_device());
    mt_autocast_begin(MT_BF16, MT_AMP_O1);
    mt_tensor *y = mt_linear_layer_forward(&l, x);
    assert_int_equal(mt_dtype_of(y), MT_BF16);
    mt_tensor *loss = mt_sum_all(y);
    mt_autocast_end();
    assert_int_equal(mt_backward(loss, NULL), 0);
    mt_tensor *gw = mt_grad(l.weight), *gb = mt_grad(l.bias);
    assert_int_equal(mt_dtype_of(gw), MT_F32);
    assert_int_equal(mt_dtype_of(gb), MT_F32);
    double four[8] = {4, 4, 4, 4, 4, 4, 4, 4};
    assert_tensor_close(gb, four, 8, 0, 0);
    mt_tensor *rel[] = {x, y, loss, gw, gb};
    for (size_t i = 0; i < 5; i++) mt_release(rel[i]);
    mt_linear_layer_free(&l);
}

static void test_errors(void **state) {
    (void)state;
    mt_linear_layer l = {0};
    assert_int_equal(mt_linear_layer_init(&l, 0, 3, true, MT_F32, mt_test_device()),
                     MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID,
                 "mt_linear_layer_init: in_features and out_features must be positive");
    assert_int_equal(mt_linear_layer_init(&l, 3, -1, true, MT_F32, mt_test_device()),
                     MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "out -1");
    assert_int_equal(mt_linear_layer_init(&l, 3, 2, true, MT_I64, mt_test_device()), MT_ERR_DTYPE);
    assert_error(MT_ERR_DTYPE, "parameters must be floating, got i64");
    assert_int_equal(mt_linear_layer_init(NULL, 3, 2, true, MT_F32, mt_test_device()), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "layer is NULL");
    assert_null(l.weight);

    mt_tensor *x = mt_randn(MT_SHAPE(2, 3), MT_F32, mt_test_device());
    assert_null(mt_linear_layer_forward(NULL, x));
    assert_error(MT_ERR_NULL, "mt_linear_layer_forward: arg 1: layer is NULL");
    assert_null(mt_linear_layer_forward(&l, x));
    assert_error(MT_ERR_STATE, "not initialised");

    assert_int_equal(mt_linear_layer_init(&l, 4, 2, false, MT_F32, mt_test_device()), 0);
    assert_null(mt_linear_layer_forward(&l, NULL));
    assert_int_equal(mt_last_status(), MT_OK);
    assert_null(mt_linear_layer_forward(&l, x));
    assert_error(MT_ERR_SHAPE, "mt_linear: arg 2: weight [2, 4] cannot multiply input [2, 3]");
    mt_linear_layer_free(&l);

    /* out of memory while drawing the weight: nothing is kept, nothing leaks */
    mt_debug_set_alloc_limit(1024);
    assert_true(mt_linear_layer_init(&l, 64, 64, true, MT_F32, mt_test_device()) == MT_ERR_OOM);
    mt_debug_set_alloc_limit(0);
    assert_error(MT_ERR_OOM, "out of memory");
    assert_null(l.weight);
    assert_null(l.bias);
    mt_release(x);
}

/* An op's error inside a layer's forward reads "<layer>_forward: <op>: ...", as errors inside
   any public call start with the call's name. */
static void assert_error_from(const char *layer_fn, const char *op) {
    char want[128];
    snprintf(want, sizeof want, "%s: %s: ", layer_fn, op);
    if (strncmp(mt_last_error(), want, strlen(want)) != 0)
        fail_msg("error \"%s\" does not start with \"%s\"", mt_last_error(), want);
    mt_clear_error();
}

static void test_layer_errors_name_the_layer(void **state) {
    (void)state;
    mt_device dev = mt_test_device();
    mt_scope_begin();
    mt_tensor *x3 = mt_zeros(MT_SHAPE(2, 3), MT_F32, dev),
              *x4 = mt_zeros(MT_SHAPE(1, 3, 4, 4), MT_F32, dev);
    mt_linear_layer lin;
    assert_int_equal(mt_linear_layer_init(&lin, 4, 2, true, MT_F32, dev), 0);
    assert_null(mt_linear_layer_forward(&lin, x3));
    assert_error_from("mt_linear_layer_forward", "mt_linear");
    mt_conv2d_layer conv;
    assert_int_equal(mt_conv2d_layer_init(&conv, 2, 4, 3, 3, NULL, true, MT_F32, dev), 0);
    assert_null(mt_conv2d_layer_forward(&conv, x4)); /* 3 channels into a 2-channel conv */
    assert_error_from("mt_conv2d_layer_forward", "mt_conv2d");
    mt_batch_norm2d_layer bn;
    assert_int_equal(mt_batch_norm2d_layer_init(&bn, 5, MT_F32, dev), 0);
    assert_null(mt_batch_norm2d_layer_forward(&bn, x4));
    assert_error_from("mt_batch_norm2d_layer_forward", "mt_batch_norm");
    mt_layer_norm_layer ln;
    assert_int_equal(mt_layer_norm_layer_init(&ln, MT_SHAPE(3), true, MT_F32, dev), 0);
    assert_null(mt_layer_norm_layer_forward(&ln, mt_zeros(MT_SHAPE(2, 3), MT_I64, dev)));
    assert_error_from("mt_layer_norm_layer_forward", "mt_layer_norm");
    mt_embedding_layer emb;
    assert_int_equal(mt_embedding_layer_init(&emb, 5, 2, MT_F32, dev), 0);
    assert_null(mt_embedding_layer_forward(&emb, x3)); /* float indices */
    assert_error_from("mt_embedding_layer_forward", "mt_embedding");
    mt_dropout_layer drop;
    assert_int_equal(mt_dropout_layer_init(&drop, 0.5), 0);
    assert_null(mt_dropout_layer_forward(&drop, mt_zeros(MT_SHAPE(2), MT_I64, dev)));
    assert_error_from("mt_dropout_layer_forward", "mt_dropout");
    mt_scope_end();
    mt_linear_layer_free(&lin);
    mt_conv2d_layer_free(&conv);
    mt_batch_norm2d_layer_free(&bn);
    mt_layer_norm_layer_free(&ln);
    mt_embedding_layer_free(&emb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_init_shapes_and_flags),
        MT_TEST(test_init_distribution),
        MT_TEST(test_init_seeded),
        MT_TEST(test_forward_reference),
        MT_TEST(test_gradcheck_layer),
        MT_TEST(test_training_reduces_loss),
        MT_TEST(test_autocast_layer),
        MT_TEST(test_errors),
        MT_TEST(test_layer_errors_name_the_layer),
    };
    return MT_RUN_TESTS(tests);
}
