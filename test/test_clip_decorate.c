/* Around an optimizer step: gradient clipping (mt_clip_grad_norm, its asynchronous form and
   expanded gradients) and O2 decorate (mt_amp_decorate before and after the optimizer is
   made, and its errors). Gradients are set with mt_set_grad, so these tests depend on no
   op's backward. */
#include <float.h>
#include "test_util.h"

/* ---------------------------------------------------------------- clip_grad_norm */

static void test_clip_grad_norm(void **state) {
    (void)state;
    mt_dtype dts[] = {MT_F32, MT_F64, MT_F16};
    for (int d = 0; d < 3; d++) {
        mt_tensor *a = mt_test_param((double[]){0, 0}, dts[d], MT_SHAPE(2));
        mt_tensor *b = mt_test_param((double[]){0}, dts[d], MT_SHAPE(1));
        mt_tensor *c = mt_test_param((double[]){0}, dts[d], MT_SHAPE(1));
        mt_tensor *ps[3] = {a, b, c};
        mt_optimizer *o = mt_sgd_new(ps, 3, NULL);
        assert_float_equal(mt_clip_grad_norm(o, 1.0), 0.0, 0); /* no gradients */
        mt_test_set_grad(a, (double[]){3, 4});
        mt_test_set_grad(b, (double[]){12}); /* c has none */
        /* below the bound: returned, unchanged */
        assert_float_equal(mt_clip_grad_norm(o, 20.0), 13.0, 1e-5);
        assert_float_equal(mt_clip_grad_norm(o, INFINITY), 13.0, 1e-5);
        mt_tensor *ga = mt_grad(a);
        assert_tensor_close(ga, ((double[]){3, 4}), 2, 0, 0);
        mt_release(ga);
        /* above: scaled to the bound */
        assert_float_equal(mt_clip_grad_norm(o, 6.5), 13.0, 1e-5);
        double coef = 6.5 / (13.0 + 1e-6), tol = dts[d] == MT_F16 ? 2e-3 : 1e-6;
        ga = mt_grad(a);
        mt_tensor *gb = mt_grad(b);
        assert_tensor_close(ga, ((double[]){3 * coef, 4 * coef}), 2, 0, tol);
        assert_tensor_close(gb, ((double[]){12 * coef}), 1, 0, tol);
        mt_release(ga);
        mt_release(gb);
        assert_float_equal(mt_clip_grad_norm(o, 100), 6.5, dts[d] == MT_F16 ? 1e-2 : 1e-5);
        /* non-finite with error_if_nonfinite: an error, gradients untouched */
        mt_test_set_grad(b, (double[]){INFINITY});
        assert_true(isnan(mt_clip_grad_norm_ex(o, 1.0, true)));
        assert_error(MT_ERR_INVALID, "total norm of the gradients is inf");
        ga = mt_grad(a);
        assert_tensor_close(ga, ((double[]){3 * coef, 4 * coef}), 2, 0, tol);
        mt_release(ga);
        /* non-finite otherwise, as torch: returned, and applied (inf: coefficient 0, so an
           inf element becomes nan; nan: every gradient nan), with no error */
        assert_true(isinf(mt_clip_grad_norm(o, 1.0)));
        assert_no_error();
        ga = mt_grad(a);
        gb = mt_grad(b);
        assert_tensor_close(ga, ((double[]){0, 0}), 2, 0, 0);
        assert_tensor_close(gb, ((double[]){NAN}), 1, 0, 0);
        mt_release(ga);
        mt_release(gb);
        mt_test_set_grad(a, (double[]){3, 4});
        mt_test_set_grad(b, (double[]){NAN});
        assert_true(isnan(mt_clip_grad_norm(o, 1.0)));
        assert_no_error(); /* a NaN norm is a value, not an error */
        ga = mt_grad(a);
        assert_tensor_close(ga, ((double[]){NAN, NAN}), 2, 0, 0);
        mt_release(ga);
        mt_test_set_grad(a, (double[]){3, 4});
        /* max_norm 0 zeroes the gradients */
        mt_test_set_grad(b, (double[]){1});
        assert_true(mt_clip_grad_norm(o, 0.0) > 0);
        ga = mt_grad(a);
        assert_tensor_close(ga, ((double[]){0, 0}), 2, 0, 0);
        mt_release(ga);
        /* an inf norm under an inf max_norm: inf / inf, every gradient nan (torch) */
        mt_test_set_grad(a, (double[]){3, 4});
        mt_test_set_grad(b, (double[]){INFINITY});
        assert_true(isinf(mt_clip_grad_norm(o, INFINITY)));
        ga = mt_grad(a);
        assert_tensor_close(ga, ((double[]){NAN, NAN}), 2, 0, 0);
        mt_release(ga);
        mt_optimizer_free(o);
        mt_release(a);
        mt_release(b);
        mt_release(c);
    }
    assert_no_error();
}

/* F64 gradients get an F64 norm and factor, from both forms: an F32 one overflowed for a
   norm of 1.4e30 (every gradient zeroed), underflowed for a max_norm of 1e-50, and rounded
   the norm of 3.0000000001 (torch computes in the gradients' dtype). */
static void test_clip_f64(void **state) {
    (void)state;
    mt_tensor *a = mt_test_param((double[]){0, 0}, MT_F64, MT_SHAPE(2));
    mt_optimizer *o = mt_sgd_new(&a, 1, NULL);
    for (int async = 0; async < 2; async++) {
        mt_scope_begin(); /* the async norms */
        mt_test_set_grad(a, (double[]){1e30, 1e30});
        double norm = async ? mt_item(mt_clip_grad_norm_async(o, 1.0)) : mt_clip_grad_norm(o, 1.0);
        assert_float_equal(norm, sqrt(2.0) * 1e30, 1e16);
        mt_tensor *g = mt_grad(a);
        assert_tensor_close(g, ((double[]){sqrt(0.5), sqrt(0.5)}), 2, 0, 1e-12);
        mt_release(g);
        mt_test_set_grad(a, (double[]){3.0000000001, 0});
        norm = async ? mt_item(mt_clip_grad_norm_async(o, 1e-50)) : mt_clip_grad_norm(o, 1e-50);
        assert_true(norm == 3.0000000001);
        g = mt_grad(a);
        double want = 3.0000000001 * (1e-50 / (3.0000000001 + 1e-6));
        assert_tensor_close(g, ((double[]){want, 0}), 2, 0, 1e-12);
        mt_release(g);
        mt_scope_end();
    }
    mt_optimizer_free(o);
    mt_release(a);
    assert_no_error();
    /* a max_norm past F32 ("no clipping") with F32 gradients: nothing is scaled, by either
       form (the async one refused to make the bound as an F32 scalar) */
    mt_tensor *b = mt_test_param((double[]){0, 0}, MT_F32, MT_SHAPE(2));
    o = mt_sgd_new(&b, 1, NULL);
    for (int async = 0; async < 2; async++) {
        mt_scope_begin();
        mt_test_set_grad(b, (double[]){3, 4});
        double norm =
            async ? mt_item(mt_clip_grad_norm_async(o, DBL_MAX)) : mt_clip_grad_norm(o, DBL_MAX);
        assert_no_error();
        assert_true(norm == 5.0);
        assert_tensor_close(mt_grad(b), ((double[]){3, 4}), 2, 0, 0);
        mt_scope_end();
    }
    mt_optimizer_free(o);
    mt_release(b);
}

/* The norm of mt_clip_grad_norm_async, read back (a 0-d tensor on the device: F64 for F64
   gradients, else F32). */
static double async_norm(mt_optimizer *o, double max_norm, mt_dtype want) {
    mt_tensor *n = mt_clip_grad_norm_async(o, max_norm);
    assert_non_null(n);
    assert_int_equal(mt_ndim(n), 0);
    assert_int_equal(mt_dtype_of(n), want);
    assert_on_test_device(n);
    double v = mt_item(n);
    mt_release(n);
    return v;
}

/* The device-side clip: torch's coefficient min(max / (norm + 1e-6), 1), no host wait,
   non-finite norms applied as torch, and the same errors. */
static void test_clip_grad_norm_async(void **state) {
    (void)state;
    mt_dtype dts[] = {MT_F32, MT_F64, MT_F16};
    for (int d = 0; d < 3; d++) {
        mt_tensor *a = mt_test_param((double[]){0, 0}, dts[d], MT_SHAPE(2));
        mt_tensor *b = mt_test_param((double[]){0}, dts[d], MT_SHAPE(1));
        mt_tensor *ps[2] = {a, b};
        mt_optimizer *o = mt_sgd_new(ps, 2, NULL);
        mt_dtype ndt = dts[d] == MT_F64 ? MT_F64 : MT_F32;
        assert_float_equal(async_norm(o, 1.0, MT_F32), 0.0, 0); /* no gradients */
        mt_test_set_grad(a, (double[]){3, 4});
        mt_test_set_grad(b, (double[]){12});
        double tol = dts[d] == MT_F16 ? 2e-3 : 1e-6;
        /* below the bound: unchanged (a coefficient of exactly 1) */
        assert_float_equal(async_norm(o, 20.0, ndt), 13.0, 1e-5);
        mt_tensor *ga = mt_grad(a);
        assert_tensor_close(ga, ((double[]){3, 4}), 2, 0, 0);
        mt_release(ga);
        /* above: scaled, and no wait until the norm is read */
        mt_synchronize(mt_test_device());
        int64_t syncs = mt_host_sync_count();
        mt_tensor *n = mt_clip_grad_norm_async(o, 6.5);
        assert_int_equal(mt_host_sync_count(), syncs);
        assert_float_equal(mt_item(n), 13.0, 1e-5);
        mt_release(n);
        double coef = 6.5 / (13.0 + 1e-6);
        ga = mt_grad(a);
        assert_tensor_close(ga, ((double[]){3 * coef, 4 * coef}), 2, 0, tol);
        mt_release(ga);
        /* inf: coefficient 0 (inf elements become nan); nan: everything nan; no error */
        mt_test_set_grad(a, (double[]){3, 4});
        mt_test_set_grad(b, (double[]){INFINITY});
        assert_true(isinf(async_norm(o, 1.0, ndt)));
        assert_no_error();
        ga = mt_grad(a);
        assert_tensor_close(ga, ((double[]){0, 0}), 2, 0, 0);
        mt_release(ga);
        mt_test_set_grad(a, (double[]){3, 4});
        mt_test_set_grad(b, (double[]){NAN});
        assert_true(isnan(async_norm(o, 1.0, ndt)));
        assert_no_error();
        ga = mt_grad(a);
        assert_tensor_close(ga, ((double[]){NAN, NAN}), 2, 0, 0);
        mt_release(ga);
        /* inside an O2 region the arithmetic stays F32 */
        mt_test_set_grad(a, (double[]){3, 4});
        mt_test_set_grad(b, (double[]){12});
        mt_autocast_begin(MT_F16, MT_AMP_O2);
        assert_float_equal(async_norm(o, 1e30, ndt), 13.0, 1e-5);
        mt_autocast_end();
        /* errors: nothing changes */
        assert_null(mt_clip_grad_norm_async(NULL, 1));
        assert_error(MT_ERR_NULL, "mt_clip_grad_norm_async: arg 1: optimizer is NULL");
        assert_null(mt_clip_grad_norm_async(o, -1));
        assert_error(MT_ERR_INVALID, "mt_clip_grad_norm_async: arg 2: max_norm -1 is invalid");
        ga = mt_grad(a);
        assert_tensor_close(ga, ((double[]){3, 4}), 2, 0, 0);
        mt_release(ga);
        mt_optimizer_free(o);
        mt_release(a);
        mt_release(b);
    }
    assert_no_error();
}

/* An expanded (stride-0) gradient is replaced by its own copy before scaling in place. */
static void test_clip_expanded_grad(void **state) {
    (void)state;
    mt_tensor *w = mt_test_param((double[]){0, 0, 0, 0}, MT_F32, MT_SHAPE(4));
    mt_tensor *one = mt_scalar(2.0, MT_F32, mt_test_device());
    mt_tensor *g = mt_tensor_expand_to(one, 1, (int64_t[]){4});
    assert_int_equal(mt_set_grad(w, g), 0);
    mt_optimizer *o = mt_sgd_new(&w, 1, NULL);
    assert_float_equal(mt_clip_grad_norm(o, 2.0), 4.0, 1e-6);
    mt_tensor *gw = mt_grad(w);
    assert_tensor_close(gw, ((double[]){1, 1, 1, 1}), 4, 1e-6, 0);
    mt_release(gw);
    assert_float_equal(mt_item(one), 2.0, 0); /* the shared element is not the grad's any more */
    mt_optimizer_free(o);
    mt_release(g);
    mt_release(one);
    mt_release(w);
    assert_no_error();
}

/* ---------------------------------------------------------------- decorate */

static void test_decorate(void **state) {
    (void)state;
    mt_dtype lows[] = {MT_F16, MT_BF16};
    for (int l = 0; l < 2; l++) {
        mt_dtype low = lows[l];
        double v0[4] = {0.1, -1.7, 3.3333, 1e-3}, v1[2] = {1.0001, 0.3}, v2[3] = {7.77, 2, -5};
        mt_tensor *w0 = mt_test_param(v0, MT_F32, MT_SHAPE(2, 2));
        mt_tensor *ln = mt_test_param(v1, MT_F32, MT_SHAPE(2)); /* a norm weight: stays FP32 */
        mt_tensor *w2 = mt_test_param(v2, MT_F32, MT_SHAPE(3));
        mt_test_set_grad(w0, (double[]){1, 1, 1, 1});
        uint64_t ver = mt_tensor_version(w0);
        mt_tensor *ps[4] = {w0, ln, w2, w0}; /* a duplicate entry is harmless */
        bool keep[4] = {false, true, false, false};
        assert_int_equal(mt_amp_decorate(ps, 4, low, keep), 0);
        assert_int_equal(mt_dtype_of(w0), low);
        assert_int_equal(mt_dtype_of(ln), MT_F32);
        assert_int_equal(mt_dtype_of(w2), low);
        assert_shape(w0, 2, 2);
        assert_true(mt_requires_grad(w0) && mt_is_leaf(w0));
        assert_true(mt_tensor_version(w0) > ver);
        assert_null(mt_grad(w0)); /* the old-dtype gradient is dropped */
        double r0[4], r2[3];
        for (int i = 0; i < 4; i++) r0[i] = mt_test_round_to(v0[i], low);
        for (int i = 0; i < 3; i++) r2[i] = mt_test_round_to(v2[i], low);
        assert_tensor_close(w0, r0, 4, 0, 0);
        assert_tensor_close(ln, v1, 2, 1e-7, 0);
        assert_tensor_close(w2, r2, 3, 0, 0);
        /* an optimizer made afterwards holds FP32 masters made from the low values */
        mt_optimizer *o =
            mt_sgd_new(ps, 3, &(mt_sgd_opts){.lr = MT_SET(1e-4), .multi_precision = true});
        assert_non_null(o);
        mt_tensor *m0 = mt_optimizer_master(o, 0), *m1 = mt_optimizer_master(o, 1),
                  *m2 = mt_optimizer_master(o, 2);
        assert_non_null(m0);
        assert_null(m1);
        assert_non_null(m2);
        assert_int_equal(mt_dtype_of(m0), MT_F32);
        assert_shape(m0, 2, 2);
        assert_tensor_close(m0, r0, 4, 0, 0);
        assert_tensor_close(m2, r2, 3, 0, 0);
        /* and a training step with low gradients works */
        mt_test_set_grad(w0, (double[]){-1, -1, -1, -1});
        mt_test_set_grad(ln, (double[]){1, 1});
        assert_int_equal(mt_optimizer_step(o), 0);
        double want[4];
        for (int i = 0; i < 4; i++) want[i] = r0[i] + (float)1e-4;
        assert_tensor_close(m0, want, 4, 1e-7, 1e-6);
        assert_tensor_close(ln, ((double[]){v1[0] - 1e-4, v1[1] - 1e-4}), 2, 1e-7, 1e-6);
        mt_release(m0);
        mt_release(m2);
        mt_optimizer_free(o);
        /* without keep_fp32 every parameter is cast */
        assert_int_equal(mt_amp_decorate(&ln, 1, low, NULL), 0);
        assert_int_equal(mt_dtype_of(ln), low);
        mt_release(w0);
        mt_release(ln);
        mt_release(w2);
    }
    assert_no_error();
}

/* Decorating after the optimizer was made is caught at the step, not silently wrong. */
static void test_decorate_after_optimizer(void **state) {
    (void)state;
    mt_tensor *w = mt_test_param((double[]){1, 2}, MT_F64, MT_SHAPE(2));
    mt_optimizer *o = mt_momentum_new(&w, 1, NULL);
    mt_test_set_grad(w, (double[]){1, 1});
    assert_int_equal(mt_optimizer_step(o), 0);
    assert_int_equal(mt_amp_decorate(&w, 1, MT_F16, NULL), 0);
    mt_test_set_grad(w, (double[]){1, 1});
    assert_int_equal(mt_optimizer_step(o), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "params[0] is now f16");
    mt_optimizer_free(o);
    mt_release(w);
    /* a multi_precision SGD (no moments) made before decorate has no master for the F16
       parameter: its steps would round away every small update, so they are refused */
    w = mt_test_param((double[]){1, 2}, MT_F32, MT_SHAPE(2));
    o = mt_sgd_new(&w, 1, &(mt_sgd_opts){.lr = MT_SET(1e-4), .multi_precision = true});
    assert_int_equal(mt_amp_decorate(&w, 1, MT_F16, NULL), 0);
    mt_test_set_grad(w, (double[]){1, 1});
    assert_int_equal(mt_optimizer_step(o), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "call mt_amp_decorate before creating the optimizer");
    assert_tensor_close(w, ((double[]){1, 2}), 2, 0, 0);
    mt_optimizer_free(o);
    mt_release(w);
}

static void test_decorate_errors(void **state) {
    (void)state;
    mt_tensor *w = mt_test_param((double[]){1, 2}, MT_F32, MT_SHAPE(2));
    mt_tensor *i64 = mt_zeros(MT_SHAPE(2), MT_I64, mt_test_device());
    mt_tensor *y = mt_mul_scalar(w, 2.0);
    assert_int_equal(mt_amp_decorate(NULL, 1, MT_F16, NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_amp_decorate: arg 1: params is NULL");
    assert_int_equal(mt_amp_decorate(&w, 0, MT_F16, NULL), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "arg 2: n is 0");
    assert_int_equal(mt_amp_decorate(&w, 1, MT_F32, NULL), MT_ERR_DTYPE);
    assert_error(MT_ERR_DTYPE, "low dtype f32 is invalid: expected f16 or bf16");
    mt_tensor *bad[2] = {w, i64};
    assert_int_equal(mt_amp_decorate(bad, 2, MT_F16, NULL), MT_ERR_DTYPE);
    assert_error(MT_ERR_DTYPE, "params[1] has dtype i64");
    assert_int_equal(mt_dtype_of(w), MT_F32); /* nothing was cast */
    bad[1] = y;
    assert_int_equal(mt_amp_decorate(bad, 2, MT_F16, NULL), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "params[1] is not a leaf (made by mt_mul_scalar)");
    bad[1] = NULL;
    assert_int_equal(mt_amp_decorate(bad, 2, MT_F16, NULL), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "params[1] is NULL");
    assert_int_equal(mt_dtype_of(w), MT_F32);
    mt_release(y);
    mt_release(i64);
    mt_release(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_clip_grad_norm),  MT_TEST(test_clip_grad_norm_async),
        MT_TEST(test_clip_f64),        MT_TEST(test_clip_expanded_grad),
        MT_TEST(test_decorate),        MT_TEST(test_decorate_after_optimizer),
        MT_TEST(test_decorate_errors),
    };
    return MT_RUN_TESTS(tests);
}
