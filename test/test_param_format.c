/* Channels-last parameters (mt_params_to_channels_last, torch's
   model.to(memory_format=torch.channels_last)): the conversion in place, the convolution's
   weight gradient in the weight's format, decorate, masters and moments keeping the layout,
   and the optimizers' and GradScaler's results equal, bit for bit, to those of the same model
   with NCHW parameters. */
#include <unistd.h>
#include "test_util.h"
#include "../src/optim/optimizer_impl.h" /* the state's layout: o->masters, o->moment1/2 */

static const int64_t W_SHAPE[4] = {4, 3, 3, 3};

/* Distinct values in [-1, 1) from seed, dtype dt, on the device under test. */
static mt_tensor *values(uint64_t seed, mt_dtype dt, int nd, const int64_t *shape) {
    return mt_test_uniform(&seed, dt, nd, shape, 0.0);
}

/* Asserts a and b hold the same values, bit for bit (any layouts). */
static void assert_same_bits(const mt_tensor *a, const mt_tensor *b) {
    assert_int_equal(mt_numel(a), mt_numel(b));
    double *va = mt_test_values(a), *vb = mt_test_values(b);
    for (int64_t i = 0; i < mt_numel(a); i++)
        if (memcmp(&va[i], &vb[i], sizeof va[i]) != 0)
            fail_msg("element %lld: %.17g vs %.17g", (long long)i, va[i], vb[i]);
    free(va);
    free(vb);
}

static bool channels_last_only(const mt_tensor *t) {
    return mt_is_channels_last(t) && !mt_is_contiguous(t);
}

static void test_params_to_channels_last(void **state) {
    (void)state;
    mt_tensor *w = values(1, MT_F32, 4, W_SHAPE), *w1 = values(2, MT_F32, MT_SHAPE(4, 3, 1, 1));
    mt_tensor *b = values(3, MT_F32, MT_SHAPE(4));
    mt_tensor *params[4] = {w, w1, b, w}; /* a duplicate entry is converted once */
    for (int i = 0; i < 3; i++) mt_set_requires_grad(params[i], true);
    mt_tensor *g = values(4, MT_F32, 4, W_SHAPE);
    assert_int_equal(mt_set_grad(w, g), 0);
    mt_tensor *w_before = mt_clone(w), *w1_before = mt_clone(w1);
    mt_tensor *grad = mt_grad(w);

    assert_int_equal(mt_params_to_channels_last(params, 4), 0);
    assert_no_error();
    /* the same tensors, the same values, NHWC strides */
    assert_true(channels_last_only(w));
    const int64_t *s = mt_strides(w);
    assert_int_equal(s[0], 27);
    assert_int_equal(s[1], 1);
    assert_int_equal(s[2], 9);
    assert_int_equal(s[3], 3);
    assert_same_bits(w, w_before);
    /* the gradient too, in place (a reference held before sees it) */
    mt_tensor *grad_after = mt_grad(w);
    assert_ptr_equal(grad_after, grad);
    assert_true(channels_last_only(grad));
    assert_same_bits(grad, g);
    /* 1x1 filters are both formats already, and 1-d parameters have none: left alone */
    assert_true(mt_is_contiguous(w1) && mt_is_channels_last(w1));
    assert_same_bits(w1, w1_before);
    assert_true(mt_is_contiguous(b));
    /* again: nothing to do */
    assert_int_equal(mt_params_to_channels_last(params, 3), 0);
    assert_true(channels_last_only(w));
    assert_same_bits(w, w_before);

    mt_release(grad_after);
    mt_release(grad);
    mt_release(w1_before);
    mt_release(w_before);
    mt_release(g);
    mt_release(b);
    mt_release(w1);
    mt_release(w);
}

/* Bad lists are refused with nothing changed, earlier valid entries included. */
static void test_params_to_channels_last_errors(void **state) {
    (void)state;
    mt_tensor *w = values(5, MT_F32, 4, W_SHAPE);
    mt_set_requires_grad(w, true);
    mt_tensor *derived = mt_mul_scalar(w, 2.0);
    mt_tensor *ints = mt_zeros(MT_SHAPE(2, 2, 2, 2), MT_I64, mt_test_device());

    assert_int_equal(mt_params_to_channels_last(NULL, 1), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_params_to_channels_last: arg 1: params is NULL");
    mt_tensor *list[2] = {w, derived};
    assert_int_equal(mt_params_to_channels_last(list, 0), MT_ERR_INVALID);
    assert_error(MT_ERR_INVALID, "mt_params_to_channels_last: arg 2: n is 0");
    assert_int_equal(mt_params_to_channels_last(list, 2), MT_ERR_STATE);
    assert_error(MT_ERR_STATE, "mt_params_to_channels_last: arg 1: params[1] is not a leaf");
    assert_true(mt_is_contiguous(w));
    list[1] = ints;
    assert_int_equal(mt_params_to_channels_last(list, 2), MT_ERR_DTYPE);
    assert_error(MT_ERR_DTYPE, "mt_params_to_channels_last: arg 1: params[1] has dtype i64");
    list[1] = NULL;
    assert_int_equal(mt_params_to_channels_last(list, 2), MT_ERR_NULL);
    assert_error(MT_ERR_NULL, "mt_params_to_channels_last: arg 1: params[1] is NULL");
    assert_true(mt_is_contiguous(w) && !mt_is_channels_last(w));

    mt_release(ints);
    mt_release(derived);
    mt_release(w);
}

/* A channels-last weight's gradient comes back channels-last, with the values of the NCHW
   weight's, under channels-last and NCHW inputs, in FP32 and under autocast BF16 (where the
   gradient flows back through the cast). The output is channels-last when the input or the
   weight is (torch's rule). */
static void test_conv_weight_grad_format(void **state) {
    (void)state;
    for (int k = 0; k < 4; k++) {
        bool x_cl = k & 1, autocast = k & 2;
        mt_scope_begin();
        mt_tensor *x = values(6, MT_F32, MT_SHAPE(2, 3, 5, 6));
        if (x_cl) x = mt_to_channels_last(x);
        mt_tensor *w_nchw = values(7, MT_F32, 4, W_SHAPE), *w_cl = mt_clone(w_nchw);
        mt_tensor *ws[2] = {w_nchw, w_cl}, *ys[2];
        assert_int_equal(mt_params_to_channels_last(&w_cl, 1), 0);
        for (int i = 0; i < 2; i++) {
            mt_set_requires_grad(ws[i], true);
            if (autocast) mt_autocast_begin(MT_BF16, MT_AMP_O1);
            ys[i] = mt_conv2d(x, ws[i], NULL, &(mt_conv2d_opts){.padding = {1, 1}});
            if (autocast) mt_autocast_end();
            mt_tensor *cot = values(8, mt_dtype_of(ys[i]), 4, mt_shape(ys[i]));
            assert_int_equal(mt_backward(ys[i], cot), 0);
        }
        assert_true(channels_last_only(ys[1]));
        assert_true(x_cl ? channels_last_only(ys[0]) : mt_is_contiguous(ys[0]));
        /* the NHWC and NCHW kernels may sum in other orders: a few ulps of the output dtype */
        double tol = autocast ? 2e-2 : 1e-5;
        double *ref = mt_test_values(ys[0]);
        assert_tensor_close(ys[1], ref, mt_numel(ys[0]), tol, tol);
        free(ref);
        mt_tensor *g_nchw = mt_grad(w_nchw), *g_cl = mt_grad(w_cl);
        assert_int_equal(mt_dtype_of(g_cl), MT_F32);
        assert_true(channels_last_only(g_cl));
        assert_true(mt_is_contiguous(g_nchw));
        ref = mt_test_values(g_nchw);
        assert_tensor_close(g_cl, ref, mt_numel(g_nchw), tol, tol);
        free(ref);
        mt_release(g_nchw);
        mt_release(g_cl);
        mt_release(w_nchw);
        assert_no_error();
        mt_scope_end();
    }
}

static mt_tensor *conv_fn(mt_tensor *const *in, void *ctx) {
    (void)ctx;
    return mt_conv2d(in[0], in[1], NULL, &(mt_conv2d_opts){.stride = {2, 1}, .padding = {1, 0}});
}

static void test_conv_channels_last_weight_gradcheck(void **state) {
    (void)state;
    mt_tensor *x = values(9, MT_F64, MT_SHAPE(1, 3, 5, 4));
    mt_tensor *in[2] = {mt_to_channels_last(x), values(10, MT_F64, 4, W_SHAPE)};
    mt_release(x);
    assert_int_equal(mt_params_to_channels_last(&in[1], 1), 0);
    mt_set_requires_grad(in[0], true);
    mt_set_requires_grad(in[1], true);
    mt_scope_begin();
    int rc = mt_gradcheck(conv_fn, in, 2, NULL, NULL);
    mt_scope_end();
    if (rc) fail_msg("gradcheck: %s", mt_last_error());
    mt_release(in[0]);
    mt_release(in[1]);
}

/* ---- the optimizers: channels-last parameters against NCHW twins */

enum { N_PARAMS = 3 };
typedef struct {
    mt_tensor *p[N_PARAMS]; /* a 3x3 filter, a 1x1 filter, a bias */
    mt_optimizer *opt;
} model;

static mt_optimizer *optimizer_of(int kind, mt_tensor **p, bool mp) {
    switch (kind) {
    case 0:
        return mt_sgd_new(p, N_PARAMS, &(mt_sgd_opts){.lr = MT_SET(0.1), .multi_precision = mp});
    case 1:
        return mt_momentum_new(p, N_PARAMS,
                               &(mt_momentum_opts){.lr = MT_SET(0.1),
                                                   .momentum = MT_SET(0.9),
                                                   .nesterov = true,
                                                   .weight_decay = 1e-2,
                                                   .multi_precision = mp});
    case 2:
        return mt_adam_new(p, N_PARAMS, &(mt_adam_opts){.lr = MT_SET(0.01), .multi_precision = mp});
    default:
        return mt_adamw_new(p, N_PARAMS,
                            &(mt_adam_opts){.lr = MT_SET(0.01), .multi_precision = mp});
    }
}

/* low: MT_F32, or F16/BF16 parameters (decorated, FP32 masters); converted to channels-last
   before decorate and the optimizer when channels_last. */
static void model_init(model *m, int kind, mt_dtype low, bool channels_last) {
    static const int64_t w1[4] = {4, 3, 1, 1}, b[1] = {4};
    const int64_t *shapes[N_PARAMS] = {W_SHAPE, w1, b};
    const int nd[N_PARAMS] = {4, 4, 1};
    for (int i = 0; i < N_PARAMS; i++) {
        m->p[i] = values(20 + (uint64_t)i, MT_F32, nd[i], shapes[i]);
        mt_set_requires_grad(m->p[i], true);
    }
    if (channels_last) assert_int_equal(mt_params_to_channels_last(m->p, N_PARAMS), 0);
    if (low != MT_F32) assert_int_equal(mt_amp_decorate(m->p, N_PARAMS, low, NULL), 0);
    m->opt = optimizer_of(kind, m->p, low != MT_F32);
    assert_non_null(m->opt);
}

static void model_free(model *m) {
    mt_optimizer_free(m->opt);
    for (int i = 0; i < N_PARAMS; i++) mt_release(m->p[i]);
}

/* Gradients of step s, the same values in each parameter's own layout. */
static void set_grads(model *m, int s, bool with_inf) {
    for (int i = 0; i < N_PARAMS; i++) {
        mt_tensor *p = m->p[i];
        mt_tensor *g =
            values(40 + 10 * (uint64_t)s + (uint64_t)i, mt_dtype_of(p), mt_ndim(p), mt_shape(p));
        if (with_inf && i == 0) {
            mt_tensor *inf =
                mt_full(MT_SHAPE(1, 1, 1, 1), mt_dtype_of(p), mt_test_device(), INFINITY);
            mt_tensor *bad = mt_add(g, inf);
            mt_release(g);
            mt_release(inf);
            g = bad;
        }
        /* in the parameter's layout, as a backward would give it */
        mt_tensor *gl =
            mt_ndim(p) == 4 && !mt_is_contiguous(p) ? mt_to_channels_last(g) : mt_retain(g);
        assert_int_equal(mt_set_grad(p, gl), 0);
        mt_release(gl);
        mt_release(g);
    }
}

/* The state's layout: every master and moment of a parameter shares its strides. */
static void assert_state_layout(const model *m, bool expect_shared) {
    const mt_optimizer *o = m->opt;
    mt_tensor **state[3] = {o->masters, o->moment1, o->moment2};
    for (int i = 0; i < N_PARAMS; i++)
        for (int k = 0; k < 3; k++) {
            const mt_tensor *t = state[k] ? state[k][i] : NULL;
            if (t) assert_true(mt_same_strides(m->p[i], t) == (expect_shared || i > 0));
        }
}

/* Three steps (with a GradScaler in the low-precision runs: the second step sees an inf and
   is skipped) give the twins the same bits. Converted before the optimizer is made (when 1),
   the state takes the parameters' layout and every step runs in memory order; converted after
   the first step (when 2), the masters and moments made so far stay row-major and the steps
   take the strided paths. */
static void test_optimizers_channels_last_match(void **state) {
    (void)state;
    const mt_dtype lows[3] = {MT_F32, MT_F16, MT_BF16};
    for (int kind = 0; kind < 4; kind++)
        for (int l = 0; l < 3; l++)
            for (int when = 1; when <= 2; when++) {
                model ref, cl;
                model_init(&ref, kind, lows[l], false);
                model_init(&cl, kind, lows[l], when == 1);
                mt_grad_scaler *sc[2] = {NULL, NULL};
                if (lows[l] != MT_F32)
                    for (int t = 0; t < 2; t++) {
                        sc[t] = mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 1.0});
                        assert_non_null(sc[t]);
                    }
                model *ms[2] = {&ref, &cl};
                for (int s = 0; s < 3; s++) {
                    if (s == 1 && when == 2)
                        assert_int_equal(mt_params_to_channels_last(cl.p, N_PARAMS), 0);
                    for (int t = 0; t < 2; t++) {
                        set_grads(ms[t], s, sc[t] && s == 1);
                        if (sc[t]) {
                            assert_int_equal(mt_grad_scaler_unscale(sc[t], ms[t]->opt), 0);
                            assert_int_equal(mt_grad_scaler_minimize(sc[t], ms[t]->opt), 0);
                        } else {
                            assert_int_equal(mt_optimizer_step(ms[t]->opt), 0);
                        }
                    }
                }
                for (int i = 0; i < N_PARAMS; i++) {
                    assert_same_bits(cl.p[i], ref.p[i]);
                    mt_tensor *g1 = mt_grad(cl.p[i]), *g0 = mt_grad(ref.p[i]);
                    assert_same_bits(g1, g0); /* unscaled in place, in either layout */
                    mt_release(g1);
                    mt_release(g0);
                }
                assert_true(channels_last_only(cl.p[0]));
                assert_state_layout(&cl, when == 1);
                for (int t = 0; t < 2; t++) mt_grad_scaler_free(sc[t]);
                model_free(&cl);
                model_free(&ref);
                assert_no_error();
            }
}

/* Clipping reads channels-last gradients in memory order: the same norm (up to the order of
   the sum) and the same scaled gradients, in their layout. */
static void test_clip_channels_last_grads(void **state) {
    (void)state;
    model ref, cl;
    model_init(&ref, 0, MT_F32, false);
    model_init(&cl, 0, MT_F32, true);
    set_grads(&ref, 0, false);
    set_grads(&cl, 0, false);
    double n0 = mt_clip_grad_norm(ref.opt, 0.5), n1 = mt_clip_grad_norm(cl.opt, 0.5);
    assert_no_error();
    assert_true(n0 > 0.5 && fabs(n1 - n0) <= 1e-6 * n0);
    for (int i = 0; i < N_PARAMS; i++) {
        mt_tensor *g1 = mt_grad(cl.p[i]), *g0 = mt_grad(ref.p[i]);
        assert_true(mt_same_strides(g1, cl.p[i]));
        double *want = mt_test_values(g0);
        assert_tensor_close(g1, want, mt_numel(g0), 1e-7, 1e-6);
        free(want);
        mt_release(g1);
        mt_release(g0);
    }
    model_free(&cl);
    model_free(&ref);
}

/* Checkpoints of a channels-last model: the file holds the NCHW values torch reads, and a
   resumed optimizer loads its state in the parameters' layout and goes on bit for bit. */
static void test_checkpoint_channels_last(void **state) {
    (void)state;
    model a, b, ref;
    model_init(&a, 2, MT_BF16, true);    /* Adam, BF16 parameters, FP32 masters */
    model_init(&ref, 2, MT_BF16, false); /* the same training in NCHW */
    for (int s = 0; s < 2; s++) {
        set_grads(&a, s, false);
        set_grads(&ref, s, false);
        assert_int_equal(mt_optimizer_step(a.opt), 0);
        assert_int_equal(mt_optimizer_step(ref.opt), 0);
    }
    char dir[] = "/tmp/mt_param_format_XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    static const char *const names[N_PARAMS] = {"w", "w1", "b"};
    mt_state *st = mt_state_new();
    for (int i = 0; i < N_PARAMS; i++) assert_int_equal(mt_state_put(st, names[i], a.p[i]), 0);
    assert_int_equal(mt_optimizer_state_save(a.opt, st, "opt."), 0);
    assert_int_equal(mt_state_save(st, path), 0);
    mt_state_free(st);
    st = mt_state_load(path, mt_test_device());
    assert_non_null(st);
    mt_tensor *w = mt_state_get(st, "w");
    assert_true(mt_is_contiguous(w));
    assert_same_bits(w, ref.p[0]);
    mt_release(w);

    model_init(&b, 2, MT_BF16, true);
    assert_int_equal(mt_state_load_into(st, NULL, b.p, names, N_PARAMS, false), 0);
    assert_int_equal(mt_optimizer_state_load(b.opt, st, "opt."), 0);
    assert_state_layout(&b, true);
    model *ms[3] = {&a, &b, &ref};
    for (int k = 0; k < 3; k++) {
        set_grads(ms[k], 2, false);
        assert_int_equal(mt_optimizer_step(ms[k]->opt), 0);
    }
    for (int i = 0; i < N_PARAMS; i++) {
        assert_same_bits(b.p[i], a.p[i]);
        assert_same_bits(b.p[i], ref.p[i]);
    }
    assert_true(channels_last_only(b.p[0]));
    mt_state_free(st);
    remove(path);
    rmdir(dir);
    model_free(&b);
    model_free(&ref);
    model_free(&a);
    assert_no_error();
}

/* Decorate casts a channels-last parameter in its layout. */
static void test_decorate_keeps_channels_last(void **state) {
    (void)state;
    mt_tensor *w = values(11, MT_F32, 4, W_SHAPE);
    mt_set_requires_grad(w, true);
    mt_tensor *ref = mt_cast(w, MT_F16);
    assert_int_equal(mt_params_to_channels_last(&w, 1), 0);
    assert_int_equal(mt_amp_decorate(&w, 1, MT_F16, NULL), 0);
    assert_int_equal(mt_dtype_of(w), MT_F16);
    assert_true(channels_last_only(w));
    assert_same_bits(w, ref);
    mt_release(ref);
    mt_release(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_params_to_channels_last),
        MT_TEST(test_params_to_channels_last_errors),
        MT_TEST(test_conv_weight_grad_format),
        MT_TEST(test_conv_channels_last_weight_gradcheck),
        MT_TEST(test_optimizers_channels_last_match),
        MT_TEST(test_clip_channels_last_grads),
        MT_TEST(test_checkpoint_channels_last),
        MT_TEST(test_decorate_keeps_channels_last),
    };
    return MT_RUN_TESTS(tests);
}
