/* GradScaler with optimizers: skipped steps leave parameters, masters and optimizer moments
   untouched (SGD, Momentum, Adam with multi_precision), step folds the unscale into the
   update, unscale's values on every dtype and layout, clipping between unscale and step, two
   optimizers in one step, and short FP16/BF16 training runs. The scaler's own rules (options,
   dynamic scale, state machine, checkpoints) are in test_grad_scaler.c. */
#include "grad_scaler_helpers.h"

/* ------------------------------------------------------------------ skipping */

typedef enum { OPT_SGD, OPT_MOMENTUM, OPT_ADAM } opt_kind;

static mt_optimizer *make_opt(opt_kind k, mt_tensor **p, int n) {
    switch (k) {
    case OPT_SGD:
        return mt_sgd_new(
            p, n, &(mt_sgd_opts){.lr = MT_SET(0.1), .weight_decay = 0.01, .multi_precision = true});
    case OPT_MOMENTUM:
        return mt_momentum_new(p, n,
                               &(mt_momentum_opts){.lr = MT_SET(0.1),
                                                   .momentum = MT_SET(0.9),
                                                   .multi_precision = true});
    case OPT_ADAM:
        return mt_adam_new(p, n, &(mt_adam_opts){.lr = MT_SET(0.01), .multi_precision = true});
    }
    return NULL;
}

#define NP 4
static const mt_dtype pdt[NP] = {MT_F32, MT_F16, MT_BF16, MT_F64};
static const double p0[NP][3] = {{0.5, -1, 2}, {1, 0.25, -0.5}, {-1, 2, 0.75}, {0.1, 0.2, 0.3}};
static const double g1[NP][3] = {
    {0.25, -0.5, 0.125}, {0.5, 0.25, -0.25}, {-0.125, 0.5, 0.25}, {0.5, -0.25, 0.75}};
static const double g2[NP][3] = {
    {-0.5, 0.25, 0.375}, {0.125, -0.5, 0.5}, {0.25, 0.25, -0.5}, {-0.25, 0.5, 0.125}};

static void set_all(mt_tensor **p, const double g[NP][3], double scale, int poison_at,
                    double poison) {
    for (int i = 0; i < NP; i++) set_grad(p[i], g[i], scale, i == poison_at ? poison : 0);
}

/* Scaler A sees clean, poisoned, clean steps; scaler B the same without the poisoned one.
   The poisoned step must change nothing, so both end bit-identical: parameters, masters, and
   the moments and Adam step count (which the following step reads). */
static void check_skip(opt_kind k, int poison_at, double poison) {
    mt_scope_begin();
    mt_tensor *pa[NP], *pb[NP];
    for (int i = 0; i < NP; i++) {
        pa[i] = param(p0[i], 3, pdt[i]);
        pb[i] = param(p0[i], 3, pdt[i]);
    }
    mt_optimizer *oa = make_opt(k, pa, NP), *ob = make_opt(k, pb, NP);
    assert_non_null(oa);
    assert_non_null(ob);
    mt_grad_scaler *sa = mt_grad_scaler_new(NULL), *sb = mt_grad_scaler_new(NULL);

    set_all(pa, g1, 65536, -1, 0);
    set_all(pb, g1, 65536, -1, 0);
    assert_int_equal(mt_grad_scaler_minimize(sa, oa), 0);
    assert_int_equal(mt_grad_scaler_minimize(sb, ob), 0);
    assert_false(mt_grad_scaler_last_step_skipped(sa));

    /* snapshot, then the poisoned step */
    double *before[NP], *master_before[NP] = {0};
    for (int i = 0; i < NP; i++) {
        before[i] = mt_test_values(pa[i]);
        mt_tensor *m = mt_optimizer_master(oa, i);
        if (pdt[i] == MT_F16 || pdt[i] == MT_BF16) assert_non_null(m);
        if (m) master_before[i] = mt_test_values(m);
    }
    set_all(pa, g2, 65536, poison_at, poison);
    assert_int_equal(mt_grad_scaler_step(sa, oa), 0);
    assert_true(mt_grad_scaler_last_step_skipped(sa));
    assert_int_equal(mt_grad_scaler_update(sa), 0);
    assert_true(mt_grad_scaler_last_step_skipped(sa));
    assert_true(mt_grad_scaler_get_scale(sa) == 32768.0f);
    assert_int_equal(mt_grad_scaler_skipped_steps(sa), 1);
    for (int i = 0; i < NP; i++) {
        assert_same(pa[i], before[i], 3);
        if (master_before[i]) assert_same(mt_optimizer_master(oa, i), master_before[i], 3);
        free(before[i]);
        free(master_before[i]);
    }

    /* the next clean step: A at scale 32768, B at 65536, same unscaled gradients */
    set_all(pa, g2, 32768, -1, 0);
    set_all(pb, g2, 65536, -1, 0);
    assert_int_equal(mt_grad_scaler_minimize(sa, oa), 0);
    assert_int_equal(mt_grad_scaler_minimize(sb, ob), 0);
    assert_false(mt_grad_scaler_last_step_skipped(sa));
    for (int i = 0; i < NP; i++) {
        double *vb = mt_test_values(pb[i]);
        assert_same(pa[i], vb, 3);
        free(vb);
        mt_tensor *mb = mt_optimizer_master(ob, i);
        if (mb) {
            double *v = mt_test_values(mb);
            assert_same(mt_optimizer_master(oa, i), v, 3);
            free(v);
        }
        /* the updates really happened */
        double *va = mt_test_values(pa[i]);
        bool moved = false;
        for (int j = 0; j < 3; j++) moved |= va[j] != p0[i][j];
        free(va);
        assert_true(moved);
    }
    mt_optimizer_free(oa);
    mt_optimizer_free(ob);
    mt_grad_scaler_free(sa);
    mt_grad_scaler_free(sb);
    assert_no_error();
    mt_scope_end();
}

static void test_skip_inf_sgd(void **state) {
    (void)state;
    check_skip(OPT_SGD, 0, INFINITY);
}
static void test_skip_nan_sgd(void **state) {
    (void)state;
    check_skip(OPT_SGD, 1, NAN);
}
static void test_skip_inf_momentum(void **state) {
    (void)state;
    check_skip(OPT_MOMENTUM, 2, -INFINITY);
}
static void test_skip_nan_momentum(void **state) {
    (void)state;
    check_skip(OPT_MOMENTUM, 3, NAN);
}
static void test_skip_inf_adam(void **state) {
    (void)state;
    check_skip(OPT_ADAM, 1, INFINITY);
}
static void test_skip_nan_adam(void **state) {
    (void)state;
    check_skip(OPT_ADAM, 0, NAN);
}

/* A gradient that overflows f16 only after scaling (a finite value times the scale) is
   caught the same way. */
static void test_skip_overflow_after_scaling(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *p = param((const double[]){1, 2, 3}, 3, MT_F16);
    mt_optimizer *o = mt_sgd_new(&p, 1, &(mt_sgd_opts){.lr = MT_SET(0.1), .multi_precision = true});
    mt_grad_scaler *s = mt_grad_scaler_new(NULL);
    set_grad(p, (const double[]){2, 0, 0}, 65536, 0); /* 131072 is inf in f16 */
    assert_int_equal(mt_grad_scaler_minimize(s, o), 0);
    assert_true(mt_grad_scaler_last_step_skipped(s));
    assert_same(p, ((const double[]){1, 2, 3}), 3);
    set_grad(p, (const double[]){1, 0, 0}, 32768, 0);
    assert_int_equal(mt_grad_scaler_minimize(s, o), 0);
    assert_false(mt_grad_scaler_last_step_skipped(s));
    assert_same(p, ((const double[]){0.89990234375, 2, 3}), 3); /* 0.9 rounded to f16 */
    mt_optimizer_free(o);
    mt_grad_scaler_free(s);
    assert_no_error();
    mt_scope_end();
}

/* step without a prior unscale leaves the true gradients behind, as torch's step does
   (the unscale is folded into the update for precision, then applied to .grad in place). */
static void test_step_leaves_true_gradients(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *p = param((const double[]){1, 2, 3}, 3, MT_F32);
    mt_optimizer *o = mt_sgd_new(&p, 1, &(mt_sgd_opts){.lr = MT_SET(0.5)});
    mt_grad_scaler *s = mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 1024});
    set_grad(p, (const double[]){2, -4, 0.25}, 1024, 0);
    assert_int_equal(mt_grad_scaler_step(s, o), 0);
    assert_tensor_close(mt_grad(p), ((const double[]){2, -4, 0.25}), 3, 0, 0);
    assert_tensor_close(p, ((const double[]){0, 4, 2.875}), 3, 0, 0);
    assert_int_equal(mt_grad_scaler_update(s), 0);
    mt_optimizer_free(o);
    mt_grad_scaler_free(s);
    assert_no_error();
    mt_scope_end();
}

/* step without unscale folds 1/scale into the optimizer kernel: an FP16 gradient whose true
   value is subnormal in FP16 reaches the FP32 master without being rounded to FP16 again. */
static void test_step_folds_unscale(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *p = param((const double[]){0.001}, 1, MT_F16);
    mt_optimizer *o = mt_sgd_new(&p, 1, &(mt_sgd_opts){.lr = MT_SET(1), .multi_precision = true});
    mt_grad_scaler *s = mt_grad_scaler_new(NULL);
    set_grad(p, (const double[]){1e-7}, 65536, 0);
    double *g16 = mt_test_values(mt_grad(p)); /* 1e-7 * 65536 rounded to f16 */
    double *m0 = mt_test_values(mt_optimizer_master(o, 0));
    assert_int_equal(mt_grad_scaler_minimize(s, o), 0);
    /* FP16 unscaling would give 2^-23 (1.19e-7) here; the folded FP32 one keeps 1e-7 */
    double want = (double)(float)(m0[0] - (double)(float)(g16[0] / 65536.0));
    assert_tensor_close(mt_optimizer_master(o, 0), &want, 1, 1e-11, 0);
    free(g16);
    free(m0);
    mt_optimizer_free(o);
    mt_grad_scaler_free(s);
    assert_no_error();
    mt_scope_end();
}

/* ------------------------------------------------------------------ unscale, clip, step */

static void test_unscale_values(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *p[NP];
    for (int i = 0; i < NP; i++) p[i] = param(p0[i], 3, pdt[i]);
    mt_optimizer *o = mt_sgd_new(p, NP, &(mt_sgd_opts){.lr = MT_SET(0.1), .multi_precision = true});
    mt_grad_scaler *s = mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 4096});
    set_all(p, g1, 4096, -1, 0);
    assert_int_equal(mt_grad_scaler_unscale(s, o), 0);
    for (int i = 0; i < NP; i++) {
        mt_tensor *g = mt_grad(p[i]);
        assert_int_equal(mt_dtype_of(g), pdt[i]);
        assert_same(g, g1[i], 3); /* power-of-two scale: exact in every dtype */
    }
    assert_int_equal(mt_grad_scaler_step(s, o), 0);
    assert_int_equal(mt_grad_scaler_update(s), 0);
    assert_tensor_close(p[0], ((const double[]){0.5 - 0.025, -1 + 0.05, 2 - 0.0125}), 3, 1e-7, 0);
    assert_tensor_close(p[3], ((const double[]){0.1 - 0.05, 0.2 + 0.025, 0.3 - 0.075}), 3, 1e-15,
                        0);
    mt_optimizer_free(o);
    mt_grad_scaler_free(s);
    assert_no_error();
    mt_scope_end();
}

/* Big gradients take the parallel path; an inf anywhere in any of them is found. */
static void test_unscale_large(void **state) {
    (void)state;
    mt_scope_begin();
    int64_t n = 200000;
    mt_tensor *a = mt_zeros(MT_SHAPE(n), MT_F32, mt_test_device()),
              *b = mt_zeros(MT_SHAPE(n), MT_F16, mt_test_device());
    mt_tensor *c = mt_zeros(MT_SHAPE(7), MT_F32, mt_test_device());
    mt_tensor *ps[3] = {a, b, c};
    for (int i = 0; i < 3; i++) mt_set_requires_grad(ps[i], true);
    mt_optimizer *o = mt_sgd_new(ps, 3, &(mt_sgd_opts){.lr = MT_SET(1), .multi_precision = true});
    mt_grad_scaler *s = mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 8});
    for (int64_t pos = 0; pos < 3; pos++) {
        mt_tensor *ga = mt_full(MT_SHAPE(n), MT_F32, mt_test_device(), 8.0);
        mt_tensor *gb = mt_full(MT_SHAPE(n), MT_F16, mt_test_device(), 16.0);
        mt_tensor *gc = mt_full(MT_SHAPE(7), MT_F32, mt_test_device(), 8.0);
        /* pos 0: inf near the end of b; pos 1: nan in the middle of a; pos 2: clean */
        mt_tensor *hole = pos == 0   ? mt_narrow(gb, 0, n - 3, 1)
                          : pos == 1 ? mt_narrow(ga, 0, n / 2, 1)
                                     : NULL;
        if (hole) assert_int_equal(mt_fill(hole, pos == 0 ? INFINITY : NAN), 0);
        assert_int_equal(mt_set_grad(a, ga), 0);
        assert_int_equal(mt_set_grad(b, gb), 0);
        assert_int_equal(mt_set_grad(c, gc), 0);
        assert_int_equal(mt_grad_scaler_unscale(s, o), 0);
        if (pos == 2) {
            double *va = mt_test_values(mt_grad(a)), *vb = mt_test_values(mt_grad(b));
            for (int64_t i = 0; i < n; i++)
                if (va[i] != 1.0 || vb[i] != 2.0)
                    fail_msg("element %lld not unscaled", (long long)i);
            free(va);
            free(vb);
        }
        assert_int_equal(mt_grad_scaler_step(s, o), 0);
        assert_int_equal(mt_grad_scaler_last_step_skipped(s), pos < 2);
        assert_int_equal(mt_grad_scaler_update(s), 0);
        if (pos < 2) mt_grad_scaler_state_set(s, &(mt_grad_scaler_state){.scale = 8});
    }
    double *va = mt_test_values(a);
    assert_true(va[0] == -1.0 && va[n - 1] == -1.0);
    free(va);
    mt_optimizer_free(o);
    mt_grad_scaler_free(s);
    assert_no_error();
    mt_scope_end();
}

/* Gradients set by hand: one tensor shared by two parameters is unscaled once, and an
   expanded (stride 0) gradient is replaced by a dense unscaled copy, its source untouched. */
static void test_unscale_shared_and_expanded(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *a = param((const double[]){1, 1, 1}, 3, MT_F32),
              *b = param((const double[]){1, 1, 1}, 3, MT_F32);
    mt_tensor *c = mt_zeros(MT_SHAPE(2, 3), MT_F32, mt_test_device());
    mt_set_requires_grad(c, true);
    mt_tensor *shared = mt_full(MT_SHAPE(3), MT_F32, mt_test_device(), 8.0);
    mt_tensor *row =
        mt_from_data((const float[]){4, 8, 12}, MT_F32, MT_SHAPE(1, 3), mt_test_device());
    mt_tensor *expanded = mt_expand(row, MT_SHAPE(2, 3));
    assert_int_equal(mt_set_grad(a, shared), 0);
    assert_int_equal(mt_set_grad(b, shared), 0);
    assert_int_equal(mt_set_grad(c, expanded), 0);
    mt_optimizer *o = mt_sgd_new((mt_tensor *[]){a, b, c}, 3, &(mt_sgd_opts){.lr = MT_SET(1)});
    mt_grad_scaler *s = mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 4});
    assert_int_equal(mt_grad_scaler_unscale(s, o), 0);
    assert_same(shared, ((const double[]){2, 2, 2}), 3);
    assert_same(mt_grad(c), ((const double[]){1, 2, 3, 1, 2, 3}), 6);
    assert_same(row, ((const double[]){4, 8, 12}), 3);
    assert_true(mt_is_contiguous(mt_grad(c)));
    assert_int_equal(mt_grad_scaler_minimize(s, o), 0);
    assert_same(a, ((const double[]){-1, -1, -1}), 3);
    assert_same(c, ((const double[]){-1, -2, -3, -1, -2, -3}), 6);
    mt_optimizer_free(o);
    mt_grad_scaler_free(s);
    assert_no_error();
    mt_scope_end();
}

/* The kernels on every dtype and on strided (transposed) gradients, and the sum of squares
   behind clipping on a tensor big enough for the parallel path. */
static void test_kernels_dtypes_layouts(void **state) {
    (void)state;
    mt_scope_begin();
    const mt_dtype dts[4] = {MT_F32, MT_F16, MT_BF16, MT_F64};
    mt_tensor *ps[5];
    for (int i = 0; i < 4; i++) {
        ps[i] = mt_zeros(MT_SHAPE(3, 2), dts[i], mt_test_device());
        mt_set_requires_grad(ps[i], true);
        /* grad = transpose of a [2, 3] tensor holding 16 * (1..6): non-contiguous */
        mt_tensor *src = mt_from_data((const double[]){16, 32, 48, 64, 80, 96}, MT_F64,
                                      MT_SHAPE(2, 3), mt_test_device());
        mt_tensor *g = mt_transpose(mt_cast(src, dts[i]), 0, 1);
        assert_false(mt_is_contiguous(g));
        assert_int_equal(mt_set_grad(ps[i], g), 0);
    }
    int64_t n = 100000;
    ps[4] = mt_zeros(MT_SHAPE(n), MT_F32, mt_test_device());
    mt_set_requires_grad(ps[4], true);
    assert_int_equal(mt_set_grad(ps[4], mt_full(MT_SHAPE(n), MT_F32, mt_test_device(), 8.0)), 0);
    mt_optimizer *o = mt_sgd_new(ps, 5, &(mt_sgd_opts){.lr = MT_SET(1), .multi_precision = true});
    mt_grad_scaler *s = mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 16});
    assert_int_equal(mt_grad_scaler_unscale(s, o), 0);
    for (int i = 0; i < 4; i++)
        assert_same(mt_grad(ps[i]), ((const double[]){1, 4, 2, 5, 3, 6}), 6);
    /* 4 * (1 + 4 + ... + 36) + n * 0.25 */
    double want = 4 * 91.0 + 0.25 * (double)n;
    double norm = mt_clip_grad_norm(o, 1e9);
    assert_no_error();
    assert_true(fabs(norm - sqrt(want)) < 1e-4 * sqrt(want));
    assert_int_equal(mt_grad_scaler_step(s, o), 0);
    assert_int_equal(mt_grad_scaler_update(s), 0);
    for (int i = 0; i < 4; i++) assert_same(ps[i], ((const double[]){-1, -4, -2, -5, -3, -6}), 6);
    mt_optimizer_free(o);
    mt_grad_scaler_free(s);
    assert_no_error();
    mt_scope_end();
}

/* The documented order for clipping: unscale, clip the true gradients, step. */
static void test_unscale_clip_step(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *p = param((const double[]){1, 1}, 2, MT_F32);
    mt_optimizer *o = mt_sgd_new(&p, 1, &(mt_sgd_opts){.lr = MT_SET(0.5)});
    mt_grad_scaler *s = mt_grad_scaler_new(NULL);
    set_grad(p, (const double[]){3, 4}, 65536, 0);
    assert_int_equal(mt_grad_scaler_unscale(s, o), 0);
    assert_same(mt_grad(p), ((const double[]){3, 4}), 2);
    double norm = mt_clip_grad_norm(o, 1.0);
    assert_no_error();
    assert_true(fabs(norm - 5.0) < 1e-6);
    assert_tensor_close(mt_grad(p), ((const double[]){0.6, 0.8}), 2, 1e-6, 0);
    assert_int_equal(mt_grad_scaler_step(s, o), 0); /* no second unscale */
    assert_int_equal(mt_grad_scaler_update(s), 0);
    assert_tensor_close(p, ((const double[]){0.7, 0.6}), 2, 1e-6, 0);
    assert_true(mt_grad_scaler_get_scale(s) == 65536.0f);
    mt_optimizer_free(o);
    mt_grad_scaler_free(s);
    assert_no_error();
    mt_scope_end();
}

/* Two optimizers in one step: each skips only for its own gradients (as PyTorch), and update
   backs off when either saw inf/nan. */
static void test_two_optimizers(void **state) {
    (void)state;
    mt_scope_begin();
    mt_tensor *a = param((const double[]){1, 1}, 2, MT_F32),
              *b = param((const double[]){1, 1}, 2, MT_F32);
    mt_optimizer *oa = mt_sgd_new(&a, 1, &(mt_sgd_opts){.lr = MT_SET(1)});
    mt_optimizer *ob = mt_sgd_new(&b, 1, &(mt_sgd_opts){.lr = MT_SET(1)});
    mt_grad_scaler *s = mt_grad_scaler_new(&(mt_grad_scaler_opts){.init_scale = 2});
    set_grad(a, (const double[]){0.5, 0.5}, 2, INFINITY);
    set_grad(b, (const double[]){0.5, 0.5}, 2, 0);
    assert_int_equal(mt_grad_scaler_step(s, oa), 0);
    assert_int_equal(mt_grad_scaler_step(s, ob), 0);
    assert_int_equal(mt_grad_scaler_update(s), 0);
    assert_same(a, ((const double[]){1, 1}), 2);
    assert_same(b, ((const double[]){0.5, 0.5}), 2);
    assert_true(mt_grad_scaler_last_step_skipped(s));
    assert_true(mt_grad_scaler_get_scale(s) == 1.0f);
    assert_int_equal(mt_grad_scaler_skipped_steps(s), 1);
    mt_optimizer_free(oa);
    mt_optimizer_free(ob);
    mt_grad_scaler_free(s);
    assert_no_error();
    mt_scope_end();
}
/* ------------------------------------------------------------------ training */

/* Fits y = x w_true^T with autocast, the scaler enabled or disabled; the loss must fall. */
static void check_training(mt_dtype low, mt_amp_level level, bool scaler_on) {
    mt_manual_seed(3);
    mt_scope_begin();
    mt_tensor *x = mt_randn(MT_SHAPE(32, 4), MT_F32, mt_test_device());
    mt_tensor *wt = mt_from_data((const float[]){0.5f, -1.0f, 2.0f, 0.25f}, MT_F32, MT_SHAPE(1, 4),
                                 mt_test_device());
    mt_tensor *t = mt_matmul(x, mt_transpose(wt, 0, 1));
    mt_tensor *w = mt_zeros(MT_SHAPE(1, 4), MT_F32, mt_test_device());
    mt_tensor *b = mt_zeros(MT_SHAPE(1), MT_F32, mt_test_device());
    mt_set_requires_grad(w, true);
    mt_set_requires_grad(b, true);
    mt_tensor *params[2] = {w, b};
    if (level == MT_AMP_O2) assert_int_equal(mt_amp_decorate(params, 2, low, NULL), 0);
    mt_optimizer *o =
        mt_sgd_new(params, 2, &(mt_sgd_opts){.lr = MT_SET(0.1), .multi_precision = true});
    mt_grad_scaler *s = mt_grad_scaler_new(&(mt_grad_scaler_opts){.disabled = !scaler_on});
    double first = 0, last = 0;
    for (int it = 0; it < 40; it++) {
        mt_scope_begin();
        mt_autocast_begin(low, level);
        mt_tensor *y = mt_linear(x, w, b);
        mt_tensor *loss = mt_mse_loss(y, t);
        mt_autocast_end();
        assert_int_equal(mt_backward(mt_grad_scaler_scale(s, loss), NULL), 0);
        assert_int_equal(mt_grad_scaler_minimize(s, o), 0);
        mt_optimizer_zero_grad(o);
        double l = mt_item(loss);
        if (it == 0) first = l;
        last = l;
        mt_scope_end();
    }
    assert_no_error();
    if (!(last < 0.02 * first)) fail_msg("loss %g -> %g did not fall", first, last);
    if (!scaler_on) assert_true(mt_grad_scaler_get_scale(s) == 1.0f);
    mt_optimizer_free(o);
    mt_grad_scaler_free(s);
    mt_scope_end();
}

static void test_train_bf16_scaler(void **state) {
    (void)state;
    check_training(MT_BF16, MT_AMP_O1, true);
}
static void test_train_bf16_no_scaler(void **state) {
    (void)state;
    check_training(MT_BF16, MT_AMP_O1, false);
}
static void test_train_f16_scaler(void **state) {
    (void)state;
    check_training(MT_F16, MT_AMP_O1, true);
}
static void test_train_o2_bf16(void **state) {
    (void)state;
    check_training(MT_BF16, MT_AMP_O2, true);
}
static void test_train_o2_f16(void **state) {
    (void)state;
    check_training(MT_F16, MT_AMP_O2, true);
}
int main(void) {
    const struct CMUnitTest tests[] = {
        MT_TEST(test_skip_inf_sgd),
        MT_TEST(test_skip_nan_sgd),
        MT_TEST(test_skip_inf_momentum),
        MT_TEST(test_skip_nan_momentum),
        MT_TEST(test_skip_inf_adam),
        MT_TEST(test_skip_nan_adam),
        MT_TEST(test_skip_overflow_after_scaling),
        MT_TEST(test_step_folds_unscale),
        MT_TEST(test_step_leaves_true_gradients),
        MT_TEST(test_unscale_values),
        MT_TEST(test_unscale_large),
        MT_TEST(test_unscale_shared_and_expanded),
        MT_TEST(test_kernels_dtypes_layouts),
        MT_TEST(test_unscale_clip_step),
        MT_TEST(test_two_optimizers),
        MT_TEST(test_train_bf16_scaler),
        MT_TEST(test_train_bf16_no_scaler),
        MT_TEST(test_train_f16_scaler),
        MT_TEST(test_train_o2_bf16),
        MT_TEST(test_train_o2_f16),
    };
    return MT_RUN_TESTS(tests);
}
